"""Rate limiters: the Redis-shared bucket (when Redis is down it limits per process) and the local one."""

from __future__ import annotations

from wmark.api.limits import RateLimiter
from wmark.api.shared_limits import SharedRateLimiter, rate_limiter


def test_without_a_url_the_limiter_is_per_process():
    assert isinstance(rate_limiter(None, "token", 1.0, 2), RateLimiter)
    assert isinstance(rate_limiter("redis://127.0.0.1:1/0", "token", 1.0, 2), SharedRateLimiter)


def test_an_unreachable_redis_falls_back_to_per_process_limits():
    # port 1: nothing listens there, the connection is refused at once
    limiter = SharedRateLimiter("redis://127.0.0.1:1/0", "test", rate=0.001, burst=2)
    waits = [limiter.acquire("tok") for _ in range(3)]
    assert waits[:2] == [0.0, 0.0] and waits[2] > 0  # still limited, by the fallback bucket
    assert limiter.acquire("other") == 0.0
