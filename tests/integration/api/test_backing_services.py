"""The service when Redis or the database hangs, refuses or is slow, in process (TestClient).

A Redis that accepts and never answers is called a few times, then not at all while the breaker
is open (counted connections, not timed), and the limits still hold, per process; 429s under
Redis limits come from the fast door of POST /v1/detect.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import fastapi.routing
import pytest
import redis
from fastapi.testclient import TestClient

from wmark.api import Settings, create_app
from wmark.keys import RegistryConfig


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
