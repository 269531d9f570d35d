"""`wmark serve --generate` under hostile use: revocation mid-queue and mid-stream, floods of big
prompts, odd values, failing generations and a queue of 0.

The servers run in this process over tiny random word-level models (conftest.py). Tests that need
the model held (a running job, jobs waiting behind it) use the `gate`; tests that need tokenising
held replace the pair's encoder with one that waits: each is bounded by progress, not the clock.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy.exc import OperationalError

from wmark.generator import engine
from wmark.vllm_gumbel import VllmWatermarkConfig

# what the harness (conftest.py: `gen`, `gate`) serves and waits for
MODEL, PROMPT, WAIT_S = "tiny", "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19", 120
ASK = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 50, "seed": 1}


def _queue_length(srv: Any) -> float:
    response = httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {srv.tokens['auditor']}"})
    (line,) = [x for x in response.text.splitlines() if x.startswith("wmark_generation_queue_length ")]
    return float(line.split()[1])


def _in_threads(work: dict[str, Any]) -> tuple[dict[str, Any], list[threading.Thread]]:
    """Start each of `work`'s calls in a thread; their result (or exception) lands in the dict."""
    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = work[name]()
        except Exception as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in work]
    for thread in threads:
        thread.start()
    return outcomes, threads


def _read_content(stream: Any, chunks: int) -> None:
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == chunks:
            return


def test_a_revoked_token_stops_its_running_and_its_queued_generations(gen, gate):
    with gen.served(method="basic-uwm", max_tokens=100, max_queue=4) as srv:
        issued = srv.registry.tokens.create("generator", "soon-revoked", actor="test")
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=issued.token, max_retries=0)
        gate.release(2)  # a stream's response starts with its first tokens
        running = client.chat.completions.create(**ASK, stream=True)
        _read_content(running, 2)
        outcomes, threads = _in_threads(
            {
                "stream": lambda: list(client.chat.completions.create(**ASK, stream=True)),
                "whole": lambda: client.chat.completions.create(**ASK),
            }
        )
        gen.until(lambda: _queue_length(srv) == 2, "two requests waiting behind the running one")
        srv.registry.tokens.revoke(issued.info.token_id, actor="test")
        gate.release(1000)

        with pytest.raises(openai.APIError) as caught:  # the stream ends with an error event
            list(running)
        assert caught.value.body["code"] == "token_revoked"
        for thread in threads:
            thread.join(WAIT_S)
        for name in ("stream", "whole"):  # refused before any output: 401 in OpenAI's shape
            assert isinstance(outcomes[name], openai.AuthenticationError), outcomes[name]
            assert gen.error(outcomes[name])["code"] == "token_revoked"

        rows = gen.generations(srv.registry)
        assert [r.result["finish_reason"] for r in rows] == ["token_revoked"] * 3
        assert {r.actor for r in rows} == {f"token:{issued.info.token_id}"}
        # the running one stopped at the first block boundary after the revocation; nothing else ran
        assert 2 <= rows[0].result["completion_tokens"] <= 3
        assert [r.result["completion_tokens"] for r in rows[1:]] == [0, 0]
        assert srv.client().chat.completions.create(**{**ASK, "max_tokens": 3}).usage.completion_tokens == 3


def test_a_revoked_key_stops_the_running_and_the_queued_generations(gen, gate):
    with gen.served(method="basic-uwm", max_tokens=100, max_queue=4) as srv:
        client = srv.client()
        gate.release(2)  # a stream's response starts with its first tokens
        running = client.chat.completions.create(**ASK, stream=True)
        _read_content(running, 2)
        outcomes, threads = _in_threads({"waiting": lambda: client.chat.completions.create(**ASK)})
        gen.until(lambda: _queue_length(srv) == 1, "a request waiting behind the running one")
        srv.registry.revoke(srv.key_id, actor="test")
        gate.release(1000)

        with pytest.raises(openai.APIError) as caught:
            list(running)
        assert caught.value.body["code"] == "key_revoked"
        threads[0].join(WAIT_S)
        assert isinstance(outcomes["waiting"], openai.ConflictError), outcomes["waiting"]
        assert gen.error(outcomes["waiting"])["code"] == "key_revoked"

        rows = gen.generations(srv.registry)
        assert [r.result["finish_reason"] for r in rows] == ["key_revoked"] * 2
        assert 2 <= rows[0].result["completion_tokens"] <= 3 and rows[1].result["completion_tokens"] == 0
        assert all(r.key_ids == (srv.key_id,) for r in rows)
        with pytest.raises(openai.InternalServerError) as caught:  # and no new generation under it:
            client.chat.completions.create(**ASK)  # the server has no key left, its operator's to fix
        assert gen.error(caught.value)["code"] == "no_generation_key"


def test_an_oversized_prompt_is_refused_before_it_is_tokenised(gen, monkeypatch):
    with gen.served(max_prompt_tokens=64) as srv:
        pair = srv.generation.pair
        calls: list[str] = []
        for name in ("encode_messages", "encode_prompt"):
            real = getattr(pair, name)
            monkeypatch.setattr(
                pair,
                name,
                lambda *args, _real=real, _name=name, **kw: calls.append(_name) or _real(*args, **kw),
            )
        client = srv.client()
        big = "w1 " * 200_000  # 600,000 characters: far more than 64 tokens of any vocabulary can hold
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**{**ASK, "messages": [{"role": "user", "content": big}]})
        assert gen.error(caught.value)["code"] == "context_length_exceeded"
        assert "characters" in gen.error(caught.value)["message"]
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=MODEL, prompt=big, max_tokens=4)
        assert gen.error(caught.value)["code"] == "context_length_exceeded"
        assert calls == []  # neither was tokenised

        # under the character bound the tokens decide: 65 words are 65 tokens, over 64
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=MODEL, prompt=" ".join(["w1"] * 65), max_tokens=4)
        assert gen.error(caught.value)["code"] == "context_length_exceeded"
        assert client.completions.create(model=MODEL, prompt=" ".join(["w1"] * 64), max_tokens=2).choices
        assert calls == ["encode_prompt", "encode_prompt"]


def test_healthz_answers_while_many_big_prompts_wait_to_be_refused(gen, monkeypatch):
    """More requests than Starlette has threads for `def` routes (40) are held in tokenising:
    the service still admits requests and answers /healthz, and only a few tokenise at once."""
    with gen.served(max_prompt_tokens=64) as srv:
        pair = srv.generation.pair
        store = srv.app.state.service.registry.tokens
        lock, release = threading.Lock(), threading.Event()
        state = {"admitted": 0, "inside": 0, "peak": 0}

        def counted_authenticate(token: str | None, _real: Any = store.authenticate) -> Any:
            info = _real(token)
            with lock:
                state["admitted"] += 1
            return info

        def held_encode(messages: Any) -> list[int]:
            with lock:
                state["inside"] += 1
                state["peak"] = max(state["peak"], state["inside"])
            release.wait(WAIT_S)
            with lock:
                state["inside"] -= 1
            return [2] * 65  # one token over the limit

        monkeypatch.setattr(store, "authenticate", counted_authenticate)
        monkeypatch.setattr(pair, "encode_messages", held_encode)
        n = 45
        body = {**ASK, "messages": [{"role": "user", "content": " ".join(["w1"] * 100)}]}
        headers = {"Authorization": f"Bearer {srv.tokens['generator']}"}
        url = f"{srv.url}/v1/chat/completions"
        outcomes, threads = _in_threads(
            {str(i): lambda: httpx.post(url, json=body, headers=headers, timeout=WAIT_S) for i in range(n)}
        )
        gen.until(lambda: state["admitted"] == n and state["inside"] > 0, "every request to be admitted")
        assert httpx.get(f"{srv.url}/healthz", timeout=WAIT_S).status_code == 200
        assert not outcomes  # every big request is still unanswered
        release.set()
        for thread in threads:
            thread.join(WAIT_S)
        assert {o.status_code for o in outcomes.values()} == {400}
        assert {o.json()["error"]["code"] for o in outcomes.values()} == {"context_length_exceeded"}
        assert 1 <= state["peak"] <= srv.generation.tokenising_threads


@contextmanager
def _one_connection(srv: Any) -> Iterator[Callable[..., tuple[int, dict[str, Any]]]]:
    """POST/GET over one keep-alive connection; a server that drops it fails the next request."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=WAIT_S)
    headers = {"Authorization": f"Bearer {srv.tokens['generator']}", "Content-Type": "application/json"}

    def request(path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        response = conn.getresponse()
        assert response.getheader("connection") != "close"
        return response.status, json.loads(response.read())

    try:
        yield request
    finally:
        conn.close()


def test_odd_values_get_a_400_in_openai_shape_on_a_kept_connection(gen):
    chat = json.dumps(ASK)[:-1]  # to append raw JSON (NaN, Infinity) to
    cases = [
        ("/v1/chat/completions", json.dumps({**ASK, "temperature": 1e-310})),  # subnormal
        ("/v1/chat/completions", json.dumps({**ASK, "temperature": 5e-324})),
        ("/v1/chat/completions", json.dumps({**ASK, "temperature": 1e-300})),
        ("/v1/chat/completions", json.dumps({**ASK, "top_p": 1e-310})),
        ("/v1/chat/completions", chat + ', "temperature": NaN}'),
        ("/v1/chat/completions", chat + ', "top_p": Infinity}'),
        ("/v1/chat/completions", chat + ', "temperature": -Infinity}'),
        ("/v1/chat/completions", json.dumps({**ASK, "messages": [{"role": "user", "content": "w1 \ud800"}]})),
        (
            "/v1/chat/completions",
            json.dumps(
                {**ASK, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}
            ),
        ),
        ("/v1/chat/completions", json.dumps({**ASK, "user": "\udc80"})),
        ("/v1/chat/completions", json.dumps({**ASK, "model": "tiny\ud800"})),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "w1 \ud83d", "max_tokens": 2})),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["\ud83d w1"], "max_tokens": 2})),
    ]
    with gen.served(method="basic-uwm") as srv:
        with _one_connection(srv) as request:
            for path, body in cases:
                status, answer = request(path, body.encode())
                assert status == 400, (body[-80:], answer)
                assert answer["error"]["type"] == "invalid_request_error", (body[-80:], answer)
            status, answer = request("/v1/chat/completions", json.dumps({**ASK, "max_tokens": 2}).encode())
            assert status == 200 and answer["usage"]["completion_tokens"] == 2
        assert len(gen.generations(srv.registry)) == 1  # none of the odd ones reached the model


def test_a_generation_that_fails_is_answered_in_openai_shape_and_audited(gen, monkeypatch):
    def broken(_inputs: Any) -> Any:
        raise RuntimeError("the sampler broke")

    monkeypatch.setitem(engine.METHODS, "basic-uwm", engine.Method(broken, True, False, False))
    with gen.served(method="basic-uwm") as srv:
        with _one_connection(srv) as request:
            status, answer = request("/v1/chat/completions", json.dumps(ASK).encode())
            assert status == 500 and answer["error"]["type"] == "server_error"
            assert answer["error"]["code"] == "internal_error" and "broke" not in answer["error"]["message"]
            status, answer = request("/v1/models")  # the connection was kept
            assert status == 200 and answer["data"][0]["id"] == MODEL
        with pytest.raises(openai.InternalServerError) as caught:  # before any output: a 500, not a stream
            list(srv.client().chat.completions.create(**ASK, stream=True))
        assert gen.error(caught.value)["code"] == "internal_error"
        rows = gen.generations(srv.registry)
        assert [(r.result["finish_reason"], r.result["completion_tokens"]) for r in rows] == [
            ("error", 0)
        ] * 2
        assert [r.result["error"] for r in rows] == ["internal_error"] * 2 and rows[0].text_sha256 is None


def test_queue_0_runs_one_generation_and_refuses_the_next_with_agreeing_retry_after(gen, gate):
    with gen.served(method="basic-uwm", max_queue=0) as srv:
        client = srv.client()
        gate.release(1)
        running = client.chat.completions.create(**ASK, stream=True)
        _read_content(running, 1)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(**ASK)
        error = gen.error(caught.value)
        seconds = int(caught.value.response.headers["retry-after"])
        assert error["code"] == "queue_full" and f"retry in {seconds} s" in error["message"]
        job = gen.running_job(srv)
        running.close()
        gen.until(job.cancelled.is_set, "the server to notice the disconnect")
        gate.release(1000)
        gen.until(lambda: srv.generation.current is None, "the model to be free")
        assert client.chat.completions.create(**{**ASK, "max_tokens": 2}).usage.completion_tokens == 2


def test_one_token_holds_at_most_its_share_and_a_client_that_leaves_frees_its_place(gen, gate):
    # the queue's places per token are bounded (one client cannot hold the model), and a waiting
    # request whose client went away gives its place back at once, not when the worker reaches it
    with gen.served(method="basic-uwm", max_tokens=100, max_queue=2, queue_per_token=2) as srv:
        mine, other = (
            srv.client(),
            openai.OpenAI(
                base_url=f"{srv.url}/v1",
                api_key=srv.registry.tokens.create("generator", "other", actor="test").token,
                max_retries=0,
            ),
        )
        gate.release(1)
        running = mine.chat.completions.create(**ASK, stream=True)
        _read_content(running, 1)
        waiting = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=WAIT_S)
        headers = {"Authorization": f"Bearer {srv.tokens['generator']}", "Content-Type": "application/json"}
        waiting.request("POST", "/v1/chat/completions", json.dumps(ASK), headers)
        gen.until(lambda: _queue_length(srv) == 1, "a request of mine waiting")
        with pytest.raises(openai.RateLimitError) as caught:  # my share (2) is taken
            mine.chat.completions.create(**ASK)
        assert "this token holds as many places" in gen.error(caught.value)["message"]
        waiting.close()  # gone while it waits: its place is free before the model is
        gen.until(lambda: _queue_length(srv) == 0, "the departed request's place to be freed")
        outcomes, threads = _in_threads(
            {"other": lambda: other.chat.completions.create(**{**ASK, "max_tokens": 3})}
        )
        gen.until(lambda: _queue_length(srv) == 1, "the other token's request waiting")
        gate.release(1000)
        list(running)
        threads[0].join(WAIT_S)
        assert outcomes["other"].usage.completion_tokens == 3
        rows = gen.generations(srv.registry)
        assert sorted(r.result["finish_reason"] for r in rows) == ["cancelled", "length", "length"]


def test_sampling_that_leaves_no_randomness_is_refused_and_a_vllm_key_does_not_stop_generation(gen):
    with gen.served(method="basic-uwm") as srv:
        client = srv.client()
        for low in ({"temperature": 0.3}, {"top_p": 1e-9}, {"temperature": 0.01, "top_p": 0.95}):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(**ASK, **low)
            assert gen.error(caught.value)["code"] == "sampling_below_floor"
        ok = client.chat.completions.create(**{**ASK, "max_tokens": 3, "temperature": 0.7, "top_p": 0.9})
        assert ok.usage.completion_tokens == 3
        # a vLLM deployment's key is detected, never generated with: it is no candidate for the
        # server's only active key
        tokenizer = srv.registry.tokenizer_ref(srv.registry.get(srv.key_id).spec.tokenizer.sha256)
        srv.registry.import_vllm_key("vllm-prod", tokenizer, VllmWatermarkConfig(key=2**63 + 12345))
        assert client.chat.completions.create(**{**ASK, "max_tokens": 3}).usage.completion_tokens == 3
        # a second wmark key makes the choice the operator's: 503, no key ids in the answer
        srv.registry.create_key("second", tokenizer)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(**{**ASK, "max_tokens": 3})
        assert gen.error(caught.value)["code"] == "no_generation_key"
        assert "wk_" not in caught.value.response.text


def test_a_pinned_key_follows_its_rotation(gen):
    registry, key_id, _ = gen.setup_registry()
    registry.close()
    with gen.served(method="basic-uwm", key_id=key_id) as srv:
        client = srv.client()
        assert client.chat.completions.create(**{**ASK, "max_tokens": 3}).usage.completion_tokens == 3
        successor = srv.registry.rotate(key_id, actor="test")
        assert client.chat.completions.create(**{**ASK, "max_tokens": 3}).usage.completion_tokens == 3
        assert gen.generations(srv.registry)[-1].key_ids == (successor.key_id,)


def test_a_chat_with_too_many_content_parts_is_refused_before_validation(gen):
    with gen.served(method="basic-uwm") as srv:
        parts = [{"type": "text", "text": ""}] * 2000 + [{"type": "text", "text": "w1"}]
        body = {**ASK, "messages": [{"role": "user", "content": parts}]}
        with pytest.raises(openai.BadRequestError) as caught:
            srv.client().chat.completions.create(**body)
        assert "2001 content parts; the limit is 1024" in gen.error(caught.value)["message"]


def test_a_stream_whose_audit_row_cannot_be_written_ends_with_the_services_503_error(gen, gate, monkeypatch):
    # the text has reached the client; the database failing at the end is told as the
    # non-streamed route tells it (503 database_unavailable), not as an internal error
    with gen.served(method="basic-uwm") as srv:
        gate.release(1000)
        audit = srv.generation.registry.audit
        real = audit.append

        def end_unreachable(*entries: Any, **options: Any) -> Any:
            if entries[0].action == "generate":  # the start row is written, the end row is not
                raise OperationalError("INSERT", {}, Exception("database is locked"))
            return real(*entries, **options)

        monkeypatch.setattr(audit, "append", end_unreachable)
        with (
            srv.client().chat.completions.create(**{**ASK, "max_tokens": 3}, stream=True) as stream,
            pytest.raises(openai.APIError) as caught,
        ):
            list(stream)
        assert caught.value.body["code"] == "database_unavailable"
        assert caught.value.body["type"] == "server_error"
        (started,) = audit.page(limit=10, action="generate_start")
        assert started.result["stream"] is True and gen.generations(srv.registry) == []


def test_a_stream_is_on_record_before_its_first_token_and_its_end_row_names_the_start(gen, gate):
    # a streamed text reaches the client block by block, so a process killed mid-stream must
    # still leave a row: the start row is written before the first block is generated
    with gen.served(method="basic-uwm") as srv:
        audit, client = srv.generation.registry.audit, srv.client()
        # the response starts with the first block, which the gate holds: ask from a thread
        outcomes, threads = _in_threads(
            {"stream": lambda: list(client.chat.completions.create(**{**ASK, "max_tokens": 4}, stream=True))}
        )
        gen.until(lambda: audit.page(limit=10, action="generate_start"), "the start row")
        (started,) = audit.page(limit=10, action="generate_start")
        assert started.key_ids == (srv.key_id,) and started.text_sha256 is None
        assert started.result["prompt_tokens"] == 10 and "completion_tokens" not in started.result
        assert gen.generations(srv.registry) == []  # nothing generated yet: the gate holds the model
        gate.release(1000)
        threads[0].join(WAIT_S)
        assert isinstance(outcomes["stream"], list), outcomes
        (ended,) = gen.generations(srv.registry)
        assert ended.result["start_seq"] == started.seq and ended.seq > started.seq
        assert ended.result["finish_reason"] == "length" and ended.result["completion_tokens"] == 4
        assert srv.client().chat.completions.create(**{**ASK, "max_tokens": 2}).usage.completion_tokens == 2
        assert len(audit.page(limit=10, action="generate_start")) == 1  # not streamed: one row
        assert "start_seq" not in gen.generations(srv.registry)[-1].result


def test_a_stream_whose_start_row_cannot_be_written_never_starts(gen, gate, monkeypatch):
    blocks: list[int] = []
    gated = engine.METHODS["basic-uwm"]
    counted = engine.Method(lambda inputs: blocks.append(1) or gated.block(inputs), True, False, False)
    monkeypatch.setitem(engine.METHODS, "basic-uwm", counted)
    with gen.served(method="basic-uwm") as srv:
        gate.release(1000)

        def unreachable(*_entries: Any, **_options: Any) -> Any:
            raise OperationalError("INSERT", {}, Exception("database is locked"))

        monkeypatch.setattr(srv.generation.registry.audit, "append", unreachable)
        with pytest.raises(openai.APIStatusError) as caught:  # an HTTP error, not a broken stream
            srv.client().chat.completions.create(**{**ASK, "max_tokens": 3}, stream=True)
        assert caught.value.status_code == 503 and gen.error(caught.value)["code"] == "database_unavailable"
        assert blocks == []  # no block was generated
