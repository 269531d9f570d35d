"""`wmark serve --generate` with the official `openai` client against a real uvicorn server.

The servers run in this process over tiny random word-level models (conftest.py). The
streamed text is detected under the served key; every generation is audited; bad input gets
OpenAI's error shape and the client's own exception types; a client that leaves stops its
generation and a full queue answers 429. The disconnect and queue tests hold the model at a gate
(a sampler that waits for the test's permission before each block), so they are bounded by the
engine's progress, not by the clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from wmark.cli.main import app as cli_app

# what the harness (conftest.py: `gen`, `gate`) serves and waits for
MODEL, PROMPT, WAIT_S = "tiny", "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19", 120


def _detect(text: str, tmp_path: Path) -> dict:
    path = tmp_path / f"{hashlib.sha256(text.encode()).hexdigest()[:8]}.txt"
    path.write_text(text)
    result = CliRunner().invoke(cli_app, ["detect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_chat_and_completions_stream_and_detect_under_the_served_key(gen, tmp_path):
    with gen.served() as srv:
        client = srv.client()
        assert [m.id for m in client.models.list().data] == [MODEL]
        messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": PROMPT}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120, seed=3)
        choice = whole.choices[0]
        assert whole.object == "chat.completion" and choice.message.role == "assistant"
        assert choice.finish_reason == "length"  # the word models never emit EOS (see conftest)
        assert whole.usage.completion_tokens == 120
        assert whole.usage.prompt_tokens == 12 and whole.usage.total_tokens == 132
        ext = whole.model_extra["wmark"]
        assert ext["key_id"] == srv.key_id and ext["method"] == "mpfr" and ext["aatps"] >= 1.0

        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=120,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        last = chunks[-2]  # then the usage-only chunk
        assert last.choices[0].finish_reason == "length" and last.model_extra["wmark"]["key_id"] == srv.key_id
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 120
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 10  # it streamed
        # the same seed and key give the same text, streamed or not
        assert streamed == choice.message.content
        detection = _detect(streamed, tmp_path)
        assert detection["verdict"] == "watermarked" and detection["key_id"] == srv.key_id

        text = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=120, temperature=0.9, top_p=0.95, seed=4
        )
        assert text.object == "text_completion" and text.usage.prompt_tokens == 10
        pieces = list(
            client.completions.create(model=MODEL, prompt=[PROMPT], max_tokens=120, seed=5, stream=True)
        )
        streamed_text = "".join(p.choices[0].text for p in pieces)
        assert pieces[-1].choices[0].finish_reason == "length"
        for generated in (text.choices[0].text, streamed_text):
            assert _detect(generated, tmp_path)["verdict"] == "watermarked"

        # the raw stream is OpenAI's: only `data:` events, each followed by a blank line, [DONE] last
        headers = {"Authorization": f"Bearer {srv.tokens['generator']}"}
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "stream": True, "seed": 6}
        raw = httpx.post(f"{srv.url}/v1/completions", json=body, headers=headers, timeout=WAIT_S)
        assert raw.headers["content-type"].startswith("text/event-stream")
        events = raw.text.split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        assert all(e.startswith("data: {") for e in events[:-2])

        # every generation audited: digests, key, counts; never the text
        rows = gen.generations(srv.registry)
        assert len(rows) == 5
        assert {r.actor for r in rows} == {f"token:{srv.tokens['generator'].split('_')[1]}"}
        assert all(r.key_ids == (srv.key_id,) for r in rows)
        first = rows[0]
        assert first.text_sha256 == hashlib.sha256(choice.message.content.encode()).hexdigest()
        assert first.result["completion_tokens"] == 120 and first.result["prompt_tokens"] == 12
        assert (
            first.result["endpoint"] == "/v1/chat/completions" and first.result["finish_reason"] == "length"
        )
        assert rows[2].result["prompt_sha256"] == hashlib.sha256(PROMPT.encode()).hexdigest()
        assert ext["audit_seq"] == first.seq
        dump = json.dumps([r.to_dict() for r in rows])
        assert PROMPT not in dump and choice.message.content[:40] not in dump

        metrics = httpx.get(
            f"{srv.url}/metrics", headers={"Authorization": f"Bearer {srv.tokens['auditor']}"}
        )
        lines = metrics.text.splitlines()
        assert f"wmark_generated_tokens_total {4 * 120 + 5}.0" in lines
        assert "wmark_generation_aatps_count 5.0" in lines
        assert "wmark_generation_queue_length 0.0" in lines
        assert 'wmark_generations_total{finish_reason="length"} 5.0' in lines


@pytest.mark.parametrize("drafter", ["ngram", "auto"])
def test_a_model_free_drafter_serves_the_same_text(gen, drafter):
    """`--drafter ngram|auto` work in the service too, and change nothing in the text."""
    ask = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40, "seed": 5}
    with gen.served() as srv:  # the tiny model drafter
        key_id, expected = srv.key_id, srv.client().chat.completions.create(**ask).choices[0].message.content
    with gen.served(drafter=drafter, key_id=key_id) as srv:  # the same key in the same registry
        assert srv.client().chat.completions.create(**ask).choices[0].message.content == expected
    assert expected


def test_bad_input_gets_openai_errors_the_client_raises(gen):
    with gen.served(max_tokens=50, max_prompt_tokens=20) as srv:
        client = srv.client()
        good = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "seed": 1}
        bad_requests = [
            ({"messages": []}, "validation_error"),
            ({"messages": [{"role": "user", "content": "  "}]}, "validation_error"),
            ({"messages": [{"role": "robot", "content": "w1"}]}, "validation_error"),
            ({"messages": [{"content": "w1"}]}, "validation_error"),
            ({"messages": "w1 w2"}, "validation_error"),
            ({"max_tokens": 51}, "context_length_exceeded"),
            ({"max_tokens": 0}, "validation_error"),
            ({"max_tokens": "4"}, "validation_error"),
            ({"temperature": 0}, "validation_error"),
            ({"temperature": "hot"}, "validation_error"),
            ({"top_p": 1.5}, "validation_error"),
            ({"n": 2}, "validation_error"),
            ({"stop": ["w3"]}, "validation_error"),
            ({"stream": "yes"}, "validation_error"),
            ({"messages": [{"role": "user", "content": " ".join(["w1"] * 21)}]}, "context_length_exceeded"),
        ]
        for change, code in bad_requests:
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(**{**good, **change})
            error = gen.error(caught.value)
            assert (error["code"], error["type"]) == (code, "invalid_request_error"), (change, error)
            assert caught.value.status_code == 400
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt=[PROMPT, PROMPT], max_tokens=4)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="", max_tokens=4)
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(**{**good, "model": "gpt-4o"})
        assert gen.error(caught.value)["code"] == "model_not_found"
        for role in ("detector", "auditor"):
            with pytest.raises(openai.PermissionDeniedError) as caught:
                srv.client(role).chat.completions.create(**good)
            assert gen.error(caught.value)["type"] == "permission_error"
        bad_token = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="nonsense", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            bad_token.chat.completions.create(**good)
        assert gen.error(caught.value)["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            bad_token.models.list()

        headers = {"Authorization": f"Bearer {srv.tokens['generator']}", "Content-Type": "application/json"}
        url = f"{srv.url}/v1/chat/completions"
        broken = httpx.post(url, content=b'{"model": "tiny", "messages": [', headers=headers)
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
        huge = httpx.post(url, content=b" " * (2 << 20), headers=headers)
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"

        # admin may generate too; nothing rejected was generated or audited as a generation
        assert srv.client("admin").chat.completions.create(**good).usage.completion_tokens == 4
        assert len(gen.generations(srv.registry)) == 1
        assert client.chat.completions.create(**good).choices[0].message.content  # still serving


# any JSON value, to put where a field's value belongs
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
_FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p"]
_FIELDS += ["seed", "n", "stream", "stream_options", "stop", "user", "echo", "unknown"]


def test_fuzzed_requests_get_a_4xx_in_openai_shape_never_a_5xx(gen):
    """A valid request with fields replaced by arbitrary JSON (or removed), and arbitrary bodies:
    each answer is a success or an OpenAI-shaped 4xx, and the server keeps serving."""
    with gen.served(max_tokens=4) as srv:
        headers = {"Authorization": f"Bearer {srv.tokens['generator']}"}
        valid = {
            "/v1/chat/completions": {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "seed": 0,
            },
            "/v1/completions": {"model": MODEL, "prompt": PROMPT, "seed": 0},
        }
        statuses: list[int] = []

        @given(
            path=st.sampled_from(sorted(valid)),
            changes=st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=3),
            removed=st.sets(st.sampled_from(_FIELDS), max_size=2),
            whole=st.none() | _JSON,
        )
        @settings(
            max_examples=150,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(path: str, changes: dict, removed: set, whole: object) -> None:
            body = (
                whole
                if whole is not None
                else {k: v for k, v in {**valid[path], **changes}.items() if k not in removed}
            )
            response = httpx.post(f"{srv.url}{path}", json=body, headers=headers, timeout=WAIT_S)
            statuses.append(response.status_code)
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert {"message", "type", "code"} <= set(error), response.text

        fuzz()
        assert 200 in statuses and 400 in statuses  # both kinds of answer were exercised
        assert (
            srv.client().completions.create(model=MODEL, prompt=PROMPT, seed=1).usage.completion_tokens == 4
        )


def test_a_client_that_disconnects_stops_its_generation(gen, gate):
    with gen.served(method="basic-uwm", max_tokens=100) as srv:
        gate.release(3)  # a stream's response starts with its first tokens
        stream = srv.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=100, seed=1, stream=True
        )
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.content)
            if seen == 3:
                break
        job = gen.running_job(srv)  # waiting for a permit: it cannot end before the close
        stream.close()
        gen.until(job.cancelled.is_set, "the server to notice the disconnect")
        gate.release(1000)
        gen.until(lambda: len(gen.generations(srv.registry)) == 1, "the generation's audit row")
        row = gen.generations(srv.registry)[0]
        assert row.result["finish_reason"] == "cancelled"
        # it stopped at the block boundary after the disconnect: the worker was at most one
        # block past what the client read (it may not yet have started the fourth)
        assert 3 <= row.result["completion_tokens"] <= 4
        while gate.acquire(blocking=False):  # the permits the first generation left unused
            pass
        # the worker writes the audit row before it lets go of the job: wait until it has, or the
        # wait below for "the generation to start" could see the first (cancelled) job still there
        gen.until(lambda: srv.generation.current is None, "the first generation to be let go")

        # the same without streaming: the request is written by hand and the socket closed
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "seed": 1}).encode()
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {srv.tokens['generator']}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(request)
            job = gen.running_job(srv)
        gen.until(job.cancelled.is_set, "the server to notice the disconnect")
        gate.release(1000)
        gen.until(lambda: len(gen.generations(srv.registry)) == 2, "the generation's audit row")
        row = gen.generations(srv.registry)[1]
        assert row.result["finish_reason"] == "cancelled" and row.result["completion_tokens"] <= 1


def test_a_full_queue_answers_429_with_retry_after(gen, gate):
    with gen.served(method="basic-uwm", max_queue=1, queue_per_token=2) as srv:  # one token, both places
        client = srv.client()
        ask = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 50, "seed": 2}
        gate.release(1)  # a stream's response starts with its first tokens
        running = client.chat.completions.create(**ask, stream=True)
        waiting: list = []  # the queue's one place; its response starts when it generates
        thread = threading.Thread(
            target=lambda: waiting.extend(client.chat.completions.create(**ask, stream=True)), daemon=True
        )
        thread.start()

        def queue_length() -> str:
            metrics = httpx.get(
                f"{srv.url}/metrics", headers={"Authorization": f"Bearer {srv.tokens['auditor']}"}
            )
            return next(x for x in metrics.text.splitlines() if x.startswith("wmark_generation_queue_length"))

        gen.until(lambda: queue_length() == "wmark_generation_queue_length 1.0", "a request waiting")
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(**ask)
        assert gen.error(caught.value)["code"] == "queue_full"
        assert int(caught.value.response.headers["retry-after"]) >= 1
        job = gen.running_job(srv)
        running.close()
        gen.until(job.cancelled.is_set, "the server to notice the disconnect")
        gate.release(1000)
        thread.join(WAIT_S)  # the waiting request runs once the model is free
        assert waiting[-1].choices[0].finish_reason == "length"
        first, second = gen.generations(srv.registry)
        assert first.result["finish_reason"] == "cancelled" and first.result["completion_tokens"] <= 2
        assert second.result["finish_reason"] == "length" and second.result["completion_tokens"] == 50
        assert client.chat.completions.create(**{**ask, "max_tokens": 3}).usage.completion_tokens == 3


def test_wmark_serve_generate_end_to_end(gen, tmp_path):
    """The command as a user runs it, in its own process, streaming to the openai client."""
    registry, key_id, tokens = gen.setup_registry()
    registry.close()
    refused = CliRunner().invoke(cli_app, ["serve", "--generate", "--workers", "2"])
    assert refused.exit_code == 2 and "serves one model pair" in refused.output
    port = gen.free_port()
    cmd = [sys.executable, "-m", "wmark.cli", "serve", "--port", str(port), "--generate"]
    cmd += ["--target", str(gen.dirs["target"]), "--drafter", str(gen.dirs["drafter"])]
    cmd += ["--precision", "exact-fp32"]
    cmd += ["--model-name", MODEL, "--key", key_id]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMARK_GENERATE_", "PROMETHEUS"))}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        gen.until(ready, "wmark serve --generate")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=tokens["generator"], max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=120,
            seed=11,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # [UNK] may be sampled and decodes to nothing: count tokens, not words
        assert chunks[-1].usage.completion_tokens == 120 and 100 <= len(text.split()) <= 120
        detection = _detect(text, tmp_path)
        assert detection["verdict"] == "watermarked" and detection["key_id"] == key_id
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    assert "Traceback" not in log.read_text()
