"""The service and the CLI when Redis or the database hangs, refuses or is slow.

A Redis that accepts and never answers is called a few times, then not at all while the breaker
is open (counted connections, not timed), and the limits still hold, per process; 429s under
Redis limits come from the fast door of POST /v1/detect. A PostgreSQL that accepts and never
answers (a listener of the test), one that stops answering on open connections (a proxy of the
test that stops forwarding: a SIGSTOPped server), and a statement held by a lock (LOCK TABLE in
another session) give the service's 503, a fast /readyz 503, and the CLI's one line and exit 2;
each of these used to hang (for 130 s, or for as long as the server or the lock).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import fastapi.routing
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from wmark.api import Settings, create_app
from wmark.cli.main import app as cli
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.config import DatabaseTimeouts

# short enough for a test, as a deployment would set them; PostgreSQL's connect timeout is >= 2 s
TIMEOUTS = DatabaseTimeouts(connect=2.0, statement=1.0, pool=2.0)
TIMEOUT_VARIABLES = {
    "WMARK_DB_CONNECT_TIMEOUT": "2",
    "WMARK_DB_STATEMENT_TIMEOUT": "1",
    "WMARK_DB_POOL_TIMEOUT": "2",
}


@pytest.fixture()
def redis_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One item per connection redis-py opens (after a failure it drops the connection, so each
    call to a failing Redis opens one)."""
    calls: list[str] = []
    connect = redis.connection.Connection.connect

    def counting(self: redis.connection.Connection) -> None:
        calls.append(f"{self.host}:{self.port}")
        connect(self)

    monkeypatch.setattr(redis.connection.Connection, "connect", counting)
    return calls


@pytest.fixture()
def hung_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


@pytest.fixture()
def solved(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per request that went through FastAPI's dependency resolution (its route handler)."""
    calls: list[int] = []
    solve = fastapi.routing.solve_dependencies

    async def counting(*args, **kwargs):
        calls.append(1)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


def _settings(home: Path, **overrides) -> Settings:
    config = RegistryConfig(home=home, database_url=f"sqlite:///{home / 'wmark.db'}")
    base = Settings(registry=config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    return replace(base, **overrides)


@pytest.fixture()
def served(tmp_path, word_tokenizer_json):
    """`serve(**settings)`: a started app and a bearer header per role, closed after the test."""
    clients: list[TestClient] = []

    def serve(**overrides) -> tuple[TestClient, dict[str, dict[str, str]]]:
        client = TestClient(create_app(_settings(tmp_path, **overrides)))
        client.__enter__()  # the lifespan: opens (and migrates) the registry
        clients.append(client)
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        registry.create_key("k", registry.add_tokenizer(word_tokenizer_json, "words"))
        tokens = registry.tokens
        headers = {
            role: {"Authorization": f"Bearer {tokens.create(role, role, actor='test').token}"}
            for role in ("detector", "auditor")
        }
        return client, headers

    yield serve
    for client in clients:
        client.__exit__(None, None, None)


def test_a_hung_redis_is_skipped_once_the_breaker_opens_and_limits_hold_per_process(
    served, hung_port, redis_calls
):
    client, headers = served(
        redis_url=f"redis://127.0.0.1:{hung_port}/0",
        redis_timeout=0.05,
        redis_breaker_failures=3,
        rate_per_second=0.001,
        rate_burst=5,
    )
    statuses = [client.post("/v1/detect", headers=headers["detector"], json={"text": "w1 w2"}).status_code]
    statuses += [client.post("/v1/detect", headers=headers["detector"], json={"text": "w1"}).status_code]
    statuses += [client.post("/v1/detect", headers=headers["detector"], json={"text": "w2"}).status_code]
    assert len(redis_calls) == 3  # three requests, three timeouts: the breaker opens
    statuses += [
        client.post("/v1/detect", headers=headers["detector"], json={"text": "w1 w2"}).status_code
        for _ in range(30)
    ]
    assert len(redis_calls) == 3  # the next 30 requests did not wait for Redis
    assert statuses == [200] * 5 + [429] * 28  # the token's burst, kept per process meanwhile
    metrics = client.get("/metrics", headers=headers["auditor"]).text.splitlines()
    assert "wmark_redis_breaker_opens_total 1.0" in metrics
    assert len(redis_calls) == 3  # the auditor's request did not call it either


@pytest.mark.redis
def test_429s_under_redis_limits_come_from_the_fast_door(served, redis_url, solved):
    client, headers = served(redis_url=redis_url, rate_per_second=0.001, rate_burst=2)
    answers = [
        client.post("/v1/detect", headers=headers["detector"], json={"text": "w1 w2"}) for _ in range(4)
    ]
    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    assert int(answers[-1].headers["retry-after"]) >= 1 and answers[-1].json()["code"] == "rate_limited"
    assert solved == []  # none went through FastAPI's handler of the route


class FreezableProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding, with every connection left open: what
    a stopped (SIGSTOP) server, a frozen VM or a dead network path looks like to its clients."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.thawed = threading.Event()
        self.thawed.set()
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):  # the listener closed
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
                self.sockets += [client, server]
                for src, dst in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                self.thawed.wait()  # frozen: the bytes wait here, unanswered
                dst.sendall(data)
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.thawed.set()
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture()
def pg_proxy(pg_url) -> Iterator[tuple[FreezableProxy, str]]:
    """A fresh PostgreSQL database reached through a `FreezableProxy`, and its URL through it."""
    proxy = FreezableProxy(("127.0.0.1", 5432))
    try:
        yield proxy, pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    finally:
        proxy.close()


def test_a_database_that_never_answers_is_a_503_and_readyz_says_so_at_once(tmp_path, hung_port):
    url = f"postgresql+psycopg://nobody@127.0.0.1:{hung_port}/x"
    config = RegistryConfig(home=tmp_path, database_url=url, timeouts=TIMEOUTS)
    settings = Settings(registry=config, ready_timeout=0.05)
    with TestClient(create_app(settings)) as client:  # the start-up's detector build gives up
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json() == {
            "code": "not_ready",
            "message": "the database did not answer within 0.05 s",
        }
        token = {"Authorization": "Bearer wmt_000000000000_" + "a" * 43}
        detect = client.post("/v1/detect", headers=token, json={"text": "w1 w2"})
        assert detect.status_code == 503 and detect.json()["code"] == "database_unavailable"
        assert str(hung_port) not in detect.text  # the driver's message stays in the server log


def test_the_cli_fails_in_one_line_with_exit_2_when_the_database_never_answers(hung_port):
    env = {**os.environ, **TIMEOUT_VARIABLES}
    env["WMARK_DATABASE_URL"] = f"postgresql+psycopg://nobody@127.0.0.1:{hung_port}/x"
    # a subprocess, as a user runs it; its timeout is a net far above the 2 s connect timeout and
    # below psycopg's own 130 s default, which was what ended the wait before
    done = subprocess.run(
        [sys.executable, "-m", "wmark.cli", "keys", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "timeout" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.postgres
def test_a_database_that_stops_answering_on_open_connections_is_a_503_until_it_answers_again(
    tmp_path, pg_proxy, word_tokenizer_json
):
    proxy, url = pg_proxy
    config = RegistryConfig(home=tmp_path, database_url=url, timeouts=TIMEOUTS)
    with TestClient(create_app(Settings(registry=config, migrate=True, ready_timeout=0.05))) as client:
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        admin = {"Authorization": f"Bearer {registry.tokens.create('admin', 'a', actor='test').token}"}
        assert client.get("/v1/keys", headers=admin).status_code == 200  # a pooled connection
        proxy.thawed.clear()  # the server stops answering; its connections stay open
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "did not answer" in ready.json()["message"]
        # the pool's ping on the open connection, then a new connection: each bounded
        stalled = client.get("/v1/keys", headers=admin)
        assert stalled.status_code == 503 and stalled.json()["code"] == "database_unavailable"
        proxy.thawed.set()
        assert client.get("/v1/keys", headers=admin).status_code == 200  # the pool dropped the dead ones
        assert client.get("/readyz").json()["status"] == "ready"


@pytest.mark.postgres
def test_a_statement_held_by_a_lock_is_cancelled_by_the_statement_timeout(tmp_path, pg_url, monkeypatch):
    config = RegistryConfig(home=tmp_path, database_url=pg_url, timeouts=TIMEOUTS)
    locker = create_engine(pg_url)
    try:
        with (
            TestClient(create_app(Settings(registry=config, migrate=True))) as client,
            locker.connect() as conn,
        ):
            registry = client.app.state.service.registry  # type: ignore[attr-defined]
            admin = {"Authorization": f"Bearer {registry.tokens.create('admin', 'a', actor='t').token}"}
            conn.execute(text("LOCK TABLE keys, api_tokens IN ACCESS EXCLUSIVE MODE"))  # until rollback
            held = client.get("/v1/keys", headers=admin)
            assert held.status_code == 503 and held.json()["code"] == "database_unavailable"
            for name, value in TIMEOUT_VARIABLES.items():
                monkeypatch.setenv(name, value)
            monkeypatch.setenv("WMARK_DATABASE_URL", pg_url)
            done = CliRunner().invoke(cli, ["tokens", "list"])
            assert done.exit_code == 2 and "statement timeout" in done.stderr, done.output
            assert done.stderr.count("\n") == 1
            conn.rollback()
            assert client.get("/v1/keys", headers=admin).status_code == 200
    finally:
        locker.dispose()


@pytest.mark.postgres
def test_migrations_are_not_cut_by_the_statement_timeout_and_restore_it(tmp_path, pg_url):
    # another process migrating holds the advisory lock for longer than the statement timeout
    config = RegistryConfig(home=tmp_path, database_url=pg_url, timeouts=replace(TIMEOUTS, statement=0.2))
    locker = create_engine(pg_url)
    opened: list[KeyRegistry] = []
    try:
        with locker.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(x'776D61726B'::bigint)"))
            opening = threading.Thread(target=lambda: opened.append(KeyRegistry.open(config)))
            opening.start()
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            while not conn.execute(text(waiting)).scalar_one():  # until it waits for the lock
                conn.commit()
                threading.Event().wait(0.05)
            threading.Event().wait(0.6)  # three statement timeouts pass while it waits
            conn.execute(text("SELECT pg_advisory_unlock(x'776D61726B'::bigint)"))
            conn.commit()
            opening.join()
        assert opened, "the migration failed"
        with opened[0].engine.connect() as conn:  # the pooled connection it migrated on
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "200ms"
    finally:
        for registry in opened:
            registry.close()
        locker.dispose()
