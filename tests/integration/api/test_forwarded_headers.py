"""X-Forwarded-For through a real `wmark serve`: ignored unless the proxy is configured.

uvicorn's own default trusts the header from 127.0.0.1, so any local client could choose the
address that its failed authentications are limited and audited under. `wmark serve` trusts it
only from `--forwarded-allow-ips` (or WMARK_FORWARDED_ALLOW_IPS / FORWARDED_ALLOW_IPS).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from wmark.keys import KeyRegistry

BAD = {"Authorization": "Bearer wmt_000000000000_" + "a" * 43}
BURST = 5


@contextmanager
def _serve(log: Path, *args: str, variables: dict[str, str] | None = None) -> Iterator[str]:
    """`wmark serve ARGS` in a subprocess on a free port (with `variables` set, and no forwarding
    variable of this environment), until /readyz answers; its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        k: v for k, v in os.environ.items() if k not in ("FORWARDED_ALLOW_IPS", "WMARK_FORWARDED_ALLOW_IPS")
    }
    env.update(WMARK_API_AUTH_FAIL_RATE="0.001", WMARK_API_AUTH_FAIL_BURST=str(BURST), **(variables or {}))
    cmd = [sys.executable, "-m", "wmark.cli", "serve", "--port", str(port), "--no-access-log", *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a safety net: the loop ends when the server answers
        while True:
            assert proc.poll() is None, f"server exited:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not ready:\n{log.read_text()}"
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _forged_failures(url: str, n: int) -> list[int]:
    """`n` bad tokens, each claiming another client address."""
    return [
        httpx.get(f"{url}/v1/audit", headers={**BAD, "X-Forwarded-For": f"203.0.113.{i}"}).status_code
        for i in range(n)
    ]


def _audited_clients() -> list[str]:
    with KeyRegistry.open(migrate=False) as registry:
        return [row.result["client"] for row in registry.audit.page(limit=100, action="auth_failed")]


def test_a_forged_x_forwarded_for_is_ignored_by_default(tmp_path):
    with _serve(tmp_path / "serve.log") as url:
        statuses = _forged_failures(url, 3 * BURST)
    # one client (the TCP peer) past its failed-authentication limit, whatever it claimed
    assert statuses == [401] * BURST + [429] * (2 * BURST)
    assert _audited_clients() == ["127.0.0.1"] * BURST


def test_x_forwarded_for_is_honoured_from_a_configured_proxy(tmp_path):
    with _serve(tmp_path / "serve.log", "--forwarded-allow-ips", "127.0.0.1") as url:
        statuses = _forged_failures(url, 2 * BURST)
    assert statuses == [401] * (2 * BURST)  # each forwarded client has a bucket of its own
    assert sorted(_audited_clients()) == sorted(f"203.0.113.{i}" for i in range(2 * BURST))


@pytest.mark.parametrize(
    ("args", "variables", "trusted"),
    [
        ((), {}, None),
        (("--forwarded-allow-ips", "10.0.0.5"), {}, "10.0.0.5"),
        ((), {"WMARK_FORWARDED_ALLOW_IPS": "10.0.0.0/8"}, "10.0.0.0/8"),
        ((), {"FORWARDED_ALLOW_IPS": "*"}, "*"),  # uvicorn's own variable, set on purpose
    ],
    ids=["default", "option", "wmark-variable", "uvicorn-variable"],
)
def test_serve_hands_uvicorn_the_configured_proxies_only(monkeypatch, args, variables, trusted):
    from typer.testing import CliRunner

    from wmark.cli.main import app

    for name in ("WMARK_FORWARDED_ALLOW_IPS", "FORWARDED_ALLOW_IPS"):
        monkeypatch.delenv(name, raising=False)
    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *_a, **kwargs: calls.append(kwargs))
    done = CliRunner().invoke(app, ["serve", "--no-migrate", *args], env=variables)
    assert done.exit_code == 0, done.output
    assert calls[0]["proxy_headers"] is (trusted is not None)
    assert calls[0]["forwarded_allow_ips"] == trusted
