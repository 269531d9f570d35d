"""The service through a real `wmark serve` (uvicorn, several worker processes), SQLite and PostgreSQL.

500 concurrent detections -> 500 audit rows -> `wmark audit verify` passes; then one row is
edited, deleted or swapped directly in the database and verify fails naming it. Metrics are
summed over the workers; the DEBUG and access logs hold no secret; property-based fuzzing of
the OpenAPI contract holds under `schemathesis run --checks all`; a slow batch does not block the
event loop; protocol errors are JSON, stalled bodies time out, query tokens stay out of the log,
and workers exit when their server is killed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig


@dataclass
class Server:
    url: str
    log: Path
    pid: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)  # WMARK_HOME / WMARK_DATABASE_URL from the fixtures
    limits = ("WMARK_API_RATE", "WMARK_API_BURST", "WMARK_API_AUTH_FAIL_RATE", "WMARK_API_AUTH_FAIL_BURST")
    env.update(dict.fromkeys(limits, "100000"))
    env.update(extra)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


@contextmanager
def serve(log: Path, *, workers: int, env: dict[str, str]) -> Iterator[Server]:
    """`wmark serve` in a subprocess (own process group), until /readyz answers."""
    port = _free_port()
    cmd = [sys.executable, "-m", "wmark.cli", "serve", "--port", str(port), "--workers", str(workers)]
    cmd += ["--log-level", "debug"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"server exited:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not ready:\n{log.read_text()}"
            time.sleep(0.2)
        yield Server(url, log, proc.pid)
    finally:
        with suppress(ProcessLookupError):  # the group is gone when a test killed it
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _setup(registry: KeyRegistry, tokenizer_json: bytes):
    key = registry.create_key("k", registry.add_tokenizer(tokenizer_json, "words"))
    tokens = {r: registry.tokens.create(r, f"{r}-test", actor="test").token for r in ("detector", "auditor")}
    return key, tokens


def _verify_cli():
    # `wmark audit verify` as a user runs it (in process: same environment, no start-up cost)
    return CliRunner().invoke(app, ["audit", "verify"], catch_exceptions=False)


async def _detect_concurrently(url: str, token: str, texts: list[str]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=180, headers=headers) as client:
        return list(await asyncio.gather(*(client.post("/v1/detect", json={"text": t}) for t in texts)))


def _row(registry: KeyRegistry, seq: int) -> dict:
    with registry.engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM audit_log WHERE seq = :s"), {"s": seq}).one()._mapping)


def _put(registry: KeyRegistry, row: dict) -> None:
    cols = ", ".join(row)
    with registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq = :seq"), row)
        conn.execute(text(f"INSERT INTO audit_log ({cols}) VALUES ({', '.join(':' + c for c in row)})"), row)


def _edit(registry: KeyRegistry, seq: int) -> Callable[[], None]:
    original = _row(registry, seq)
    with registry.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE audit_log SET result = REPLACE(result, 'watermarked', 'not_detected') WHERE seq = :s"
            ),
            {"s": seq},
        )
    return lambda: _put(registry, original)


def _delete(registry: KeyRegistry, seq: int) -> Callable[[], None]:
    original = _row(registry, seq)
    with registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq = :s"), {"s": seq})
    return lambda: _put(registry, original)


def _swap(registry: KeyRegistry, seq: int) -> Callable[[], None]:
    a, b = _row(registry, seq), _row(registry, seq + 1)
    _put(registry, {**b, "seq": seq})
    _put(registry, {**a, "seq": seq + 1})
    return lambda: (_put(registry, a), _put(registry, b))


def test_500_concurrent_detections_are_audited_and_tampering_is_found(
    registry, registry_config, word_tokenizer_json, planted, tmp_path
):
    key, tokens = _setup(registry, word_tokenizer_json)
    material = registry.material(key.key_id)
    distinct = [
        " ".join(f"w{i - 1}" for i in planted(material, 200, np.random.default_rng(s))) for s in range(10)
    ]
    texts = [distinct[i % 10] for i in range(500)]
    env = _env()
    with serve(tmp_path / "server.log", workers=4, env=env) as server:
        responses = asyncio.run(_detect_concurrently(server.url, tokens["detector"], texts))
        assert [r.status_code for r in responses] == [200] * 500
        bodies = [r.json() for r in responses]
        assert {b["verdict"] for b in bodies} == {"watermarked"}
        seqs = sorted(b["audit_seq"] for b in bodies)
        assert len(set(seqs)) == 500
        auditor = {"Authorization": f"Bearer {tokens['auditor']}"}
        metrics = httpx.get(f"{server.url}/metrics", headers=auditor, timeout=30).text
        # multiprocess mode: the counters of all 4 workers are summed
        assert 'wmark_detections_total{verdict="watermarked"} 500.0' in metrics.splitlines()
        assert 'wmark_http_requests_total{method="POST",route="/v1/detect",status="200"} 500.0' in metrics
    log = (tmp_path / "server.log").read_text()

    detect_rows = registry.audit.page(limit=1000, action="detect")
    assert len(detect_rows) == 500 and sorted(r.seq for r in detect_rows) == seqs
    assert {r.actor for r in detect_rows} == {f"token:{tokens['detector'].split('_')[1]}"}
    verified = _verify_cli()
    assert verified.exit_code == 0, verified.output
    assert registry.audit.verify().rows == registry.audit.count() >= 500

    for tamper, seq in ((_edit, seqs[123]), (_delete, seqs[250]), (_swap, seqs[377])):
        restore = tamper(registry, seq)
        failed = _verify_cli()
        assert failed.exit_code == 1, failed.output
        assert f"row {seq}:" in failed.stderr, (tamper.__name__, failed.stderr)
        restore()
        assert _verify_cli().exit_code == 0

    # the DEBUG and access logs of every worker: requests are there, secrets are not
    assert 'POST /v1/detect HTTP/1.1" 200' in log and "GET /metrics" in log
    secrets = list(tokens.values()) + [t[17:] for t in tokens.values()]
    raw = material.secret.reveal()
    secrets += [
        raw.hex(),
        base64.b64encode(raw).decode(),
        RegistryConfig.from_env().key_file.read_text().strip(),
    ]
    for secret in secrets:
        assert secret not in log
    assert distinct[0] not in log  # nor the texts


def test_a_slow_batch_does_not_block_other_requests(word_tokenizer_json, tmp_path):
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:  # SQLite in WMARK_HOME
        _key, tokens = _setup(registry, word_tokenizer_json)
    rng = np.random.default_rng(0)
    items = [{"text": " ".join(f"w{i}" for i in rng.integers(0, 500, 20_000))} for _ in range(60)]
    env = _env(
        WMARK_API_MAX_BODY_BYTES=str(16 << 20),
        WMARK_API_MAX_BATCH="100",
        WMARK_API_MAX_TEXT_CHARS="1000000",
        WMARK_API_MAX_REQUEST_CHARS="100000000",
    )
    with serve(tmp_path / "server.log", workers=1, env=env) as server:
        headers = {"Authorization": f"Bearer {tokens['detector']}"}
        timings: dict[str, float] = {}

        def batch() -> None:
            start = time.perf_counter()
            resp = httpx.post(
                f"{server.url}/v1/detect/batch", json={"items": items}, headers=headers, timeout=300
            )
            assert resp.status_code == 200
            timings["batch"] = time.perf_counter() - start

        worker = threading.Thread(target=batch)
        worker.start()
        time.sleep(0.3)  # the batch is being detected now
        health = []
        while worker.is_alive() and len(health) < 20:
            start = time.perf_counter()
            assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
            health.append(time.perf_counter() - start)
        worker.join()
    assert len(health) >= 3, f"the batch took {timings['batch']:.2f} s: too fast to test"
    # the loop answers while a thread detects: each /healthz well under the whole batch's time
    assert max(health) < timings["batch"] / 3, (health, timings)


def _raw(url: str, request: bytes) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _json_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


def test_protocol_errors_stalled_bodies_and_query_tokens(word_tokenizer_json, tmp_path):
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:  # SQLite in WMARK_HOME
        _key, tokens = _setup(registry, word_tokenizer_json)
    env = _env(WMARK_API_BODY_TIMEOUT="0.5")
    with serve(tmp_path / "server.log", workers=1, env=env) as server:
        nul = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n"
        status, body = _json_error(_raw(server.url, nul))
        assert status == 400 and body["code"] == "bad_request"
        bad_length = b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Length: 12x\r\n\r\n{}"
        status, body = _json_error(_raw(server.url, bad_length))
        assert status == 400 and body["code"] == "bad_request"
        # a body that stops arriving is answered 408 and the connection closed (the read returns)
        stalled = (
            f"POST /v1/detect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tokens['detector']}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"text": "w1'
        ).encode()
        status, body = _json_error(_raw(server.url, stalled))
        assert status == 408 and body["code"] == "request_timeout"
        # a token in the query string is not how to authenticate, and never reaches the log
        leaked = httpx.get(f"{server.url}/v1/audit", params={"token": tokens["auditor"], "limit": "5"})
        assert leaked.status_code == 401
    log = (tmp_path / "server.log").read_text()
    assert "GET /v1/audit?token=***&limit=5" in log
    assert tokens["auditor"] not in log and tokens["auditor"][17:] not in log


def _children(pid: int) -> set[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_workers_exit_when_the_server_process_is_killed(word_tokenizer_json, tmp_path):
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        _setup(registry, word_tokenizer_json)
    with serve(tmp_path / "server.log", workers=2, env=_env()) as server:
        parent = int(server.pid)
        workers: set[int] = set()
        for _ in range(600):  # until uvicorn's supervisor has started both workers
            workers = {p for p in _children(parent) if "spawn_main" in _cmdline(p)}
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2, _children(parent)
        metrics_dir = Path(_environ(min(workers))["PROMETHEUS_MULTIPROC_DIR"])
        os.kill(parent, signal.SIGKILL)
        # bounded by progress: each poll either sees the workers gone or waits for their watch
        # (0.5 s) and graceful shutdown; the bound only turns a hang into a failure
        for _ in range(1200):
            if not any(_running(w) for w in workers):
                break
            time.sleep(0.05)
        assert not any(_running(w) for w in workers), "workers still serving after kill -9"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/healthz", timeout=5)
    assert metrics_dir.exists()  # left behind by the killed server ...
    with serve(tmp_path / "server2.log", workers=2, env=_env()):
        assert not metrics_dir.exists()  # ... and removed by the next one


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


# ---- the OpenAPI contract, checked by schemathesis ------------------------------------------------

ST_EXAMPLES = 10  # per operation and phase: ~550 requests, ~15 s here


def test_the_openapi_contract_holds_under_schemathesis_checks_all(word_tokenizer_json, planted, tmp_path):
    """`st run --checks all`: every status documented with its schema, schema-valid requests
    accepted, invalid ones rejected, Allow headers, auth checks, stateful links; zero failures."""
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:  # SQLite in WMARK_HOME
        key, _ = _setup(registry, word_tokenizer_json)
        admin = registry.tokens.create("admin", "fuzz", actor="test").token
    st = Path(sys.executable).with_name("st")
    with serve(tmp_path / "server.log", workers=1, env=_env()) as server:
        run = subprocess.run(
            [str(st), "--config-file", str(Path(__file__).with_name("schemathesis.toml"))]
            + ["run", f"{server.url}/openapi.json", "--checks", "all", "--seed", "1"]
            + ["--max-examples", str(ST_EXAMPLES), "-H", f"Authorization: Bearer {admin}"]
            + ["--report-dir", str(tmp_path / "st"), "--no-color"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert " passed" in run.stdout and "failures" not in run.stdout.split("SUMMARY")[-1].lower()
        # the service still detects after the fuzzing (which may have revoked keys: a fresh one)
        with KeyRegistry.open(RegistryConfig.from_env()) as registry:
            fresh = registry.create_key("after", key.spec.tokenizer)
            ids = planted(registry.material(fresh.key_id), 100, np.random.default_rng(1))
        body = {"text": " ".join(f"w{i - 1}" for i in ids), "key_ids": [fresh.key_id]}
        resp = httpx.post(f"{server.url}/v1/detect", json=body, headers={"Authorization": f"Bearer {admin}"})
        assert resp.status_code == 200 and resp.json()["verdict"] == "watermarked", resp.text
    assert "Traceback" not in (tmp_path / "server.log").read_text()
