"""Rate limiters: the Redis-shared bucket and its breaker (a Redis that hangs or refuses is called a
few times, then not at all until the breaker probes it; limits are per process meanwhile)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
import redis

from wmark.api.breaker import CircuitBreaker
from wmark.api.limits import RateLimiter
from wmark.api.shared_limits import RedisOptions, SharedRateLimiter, rate_limiters, redis_client


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def redis_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One item per connection redis-py opens: after a failure (refused, timed out) it drops the
    connection, so each call to a failing Redis opens one."""
    calls: list[str] = []
    connect = redis.connection.Connection.connect

    def counting(self: redis.connection.Connection) -> None:
        calls.append(f"{self.host}:{self.port}")
        connect(self)

    monkeypatch.setattr(redis.connection.Connection, "connect", counting)
    return calls


@pytest.fixture()
def hung_redis() -> Iterator[str]:
    """A port that accepts connections (the kernel completes them) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


@pytest.fixture()
def refusing_redis() -> Iterator[str]:
    """A port bound by nobody listening: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def _options(url: str) -> RedisOptions:
    return RedisOptions(url=url, timeout=0.05, failures=3, reset_after=30.0)


def test_without_redis_the_limiters_are_per_process():
    limiters = rate_limiters(None, {"token": (1.0, 2), "auth_fail": (1.0, 2)}, on_open=lambda: None)
    assert all(isinstance(limiter, RateLimiter) for limiter in limiters.values())
    shared = rate_limiters(_options("redis://127.0.0.1:1/0"), {"a": (1.0, 2), "b": (1.0, 2)}, on_open=print)
    assert all(isinstance(limiter, SharedRateLimiter) for limiter in shared.values())
    assert shared["a"].breaker is shared["b"].breaker  # one Redis, one breaker


@pytest.mark.parametrize("server", ["hung_redis", "refusing_redis"])
def test_a_failing_redis_opens_the_breaker_and_is_not_called_while_it_is_open(
    server, request, redis_calls, caplog
):
    url = request.getfixturevalue(server)
    opened: list[int] = []
    limiters = rate_limiters(
        _options(url), {"token": (0.001, 5), "auth_fail": (0.001, 5)}, on_open=lambda: opened.append(1)
    )
    token, auth = limiters["token"], limiters["auth_fail"]
    assert isinstance(token, SharedRateLimiter) and isinstance(auth, SharedRateLimiter)
    with caplog.at_level(logging.WARNING, logger="wmark.api"):
        waits = [token.acquire("tok") for _ in range(3)]  # three calls, three failures
        assert len(redis_calls) == 3 and opened == [1] and token.breaker.is_open
        waits += [token.acquire("tok") for _ in range(40)]
        auth_waits = [auth.acquire("10.0.0.1") for _ in range(10)]
    assert len(redis_calls) == 3  # the next 50 requests, of either limiter, made no Redis call
    # limited all along, per process: the fallback bucket's burst of 5, then waits
    assert waits[:5] == [0.0] * 5 and all(wait > 0 for wait in waits[5:])
    assert auth_waits[:5] == [0.0] * 5 and all(wait > 0 for wait in auth_waits[5:])
    breaker_lines = [r.getMessage() for r in caplog.records if "breaker" in r.getMessage()]
    assert len(breaker_lines) == 1 and "rate limits are per process" in breaker_lines[0]  # logged once


def test_the_breaker_probes_redis_once_per_reset_period(hung_redis, redis_calls):
    clock = Clock()
    opened: list[int] = []
    breaker = CircuitBreaker("Redis", "per process", 3, 30.0, on_open=lambda: opened.append(1), clock=clock)
    limiter = SharedRateLimiter(redis_client(_options(hung_redis)), breaker, "token", 1000.0, 1000)
    for _ in range(3):
        limiter.acquire("tok")
    assert len(redis_calls) == 3 and breaker.is_open
    clock.now += 29.9
    for _ in range(10):
        limiter.acquire("tok")
    assert len(redis_calls) == 3  # still open
    clock.now += 0.2
    for _ in range(10):
        limiter.acquire("tok")
    assert len(redis_calls) == 4  # one probe, which failed: open again for a period
    clock.now += 30.1
    limiter.acquire("tok")
    assert len(redis_calls) == 5 and opened == [1]  # one outage, one metric increment


def test_the_breaker_closes_after_a_successful_probe_and_counts_failures_in_a_row():
    clock = Clock()
    opened: list[int] = []
    breaker = CircuitBreaker("Redis", "per process", 3, 10.0, on_open=lambda: opened.append(1), clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failed()
    breaker.succeeded()  # a success in between: the count starts again
    for _ in range(2):
        breaker.failed()
    assert not breaker.is_open and breaker.allow()
    breaker.failed()
    assert breaker.is_open and not breaker.allow() and opened == [1]
    clock.now += 10.0
    assert breaker.allow()  # the probe ...
    assert not breaker.allow()  # ... and only one at a time: the others use their fallback
    breaker.succeeded()
    assert not breaker.is_open and breaker.allow() and breaker.allow()
    for _ in range(3):
        breaker.failed()
    assert breaker.is_open and opened == [1, 1]  # a new outage
