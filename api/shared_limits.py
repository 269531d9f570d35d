"""Rate limits shared by every worker and process of the service, kept in Redis.

With `WMARK_REDIS_URL` set, each API token's (and each client address's failed-authentication)
token bucket lives in Redis and is updated by one Lua script, atomically, with Redis's clock: N
workers, or N machines, give a token its configured rate once, not N times. Without Redis the
buckets are per process (`RateLimiter`).

If Redis stops answering, requests are limited per process until it is back (rate limiting
protects the service; it must not take it down). Every call is bounded by `RedisOptions.timeout`
(connect and socket, no retry), and a `breaker.CircuitBreaker` shared by the process's limiters
stops calling Redis after `failures` failures in a row: for `reset_after` seconds no request waits
for Redis at all, then one request probes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wmark.api.breaker import CircuitBreaker
from wmark.api.limits import RateLimiter

__all__ = ["RedisOptions", "SharedRateLimiter", "rate_limiters", "redis_client"]

log = logging.getLogger("wmark.api")

# KEYS[1]: the bucket; ARGV: rate per second, burst. Returns the seconds to wait (0: allowed).
_TOKEN_BUCKET = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
level = math.min(burst, level + math.max(0, now - at) * rate)
local wait = 0
if level >= 1 then level = level - 1 else wait = (1 - level) / rate end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


@dataclass(frozen=True, kw_only=True)
class RedisOptions:
    """How the service talks to Redis (`api.settings.Settings` reads them from the environment).

    Attributes:
        url: Redis URL (redis://host:port/db).
        timeout: seconds to connect, and to wait for an answer, per call; no retry.
        failures: consecutive failed calls that open the breaker.
        reset_after: seconds the breaker stays open before one request probes Redis again.
    """

    url: str
    timeout: float
    failures: int
    reset_after: float


class SharedRateLimiter:
    """Token buckets by key in Redis; the same `acquire` as `RateLimiter`.

    Args:
        client: a redis-py client (`redis.Redis`) with its timeouts set.
        breaker: the breaker of that Redis, shared by the process's limiters.
        namespace: prefix of this limiter's keys (one limiter per purpose).
        rate, burst: as for `RateLimiter`.
    """

    def __init__(self, client: Any, breaker: CircuitBreaker, namespace: str, rate: float, burst: int) -> None:
        import redis

        self._script = client.register_script(_TOKEN_BUCKET)
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self.breaker = breaker
        self._namespace = namespace
        self._args = (repr(float(rate)), str(int(burst)))
        self.fallback = RateLimiter(rate, burst)

    def acquire(self, key: str) -> float:
        """Take one token for `key`: 0.0 if allowed, else the seconds until one is available."""
        if not self.breaker.allow():
            return self.fallback.acquire(key)
        try:
            wait = float(self._script(keys=[f"wmark:rate:{self._namespace}:{key}"], args=self._args))
        except self._errors:
            self.breaker.failed()
            return self.fallback.acquire(key)
        self.breaker.succeeded()
        return wait


def rate_limiters(
    redis: RedisOptions | None, limits: dict[str, tuple[float, int]], *, on_open: Callable[[], object]
) -> dict[str, RateLimiter | SharedRateLimiter]:
    """One limiter per namespace of `limits` (namespace -> (rate, burst)): shared through Redis,
    with one client and one breaker (`on_open` called when it opens), when `redis` is set; else
    per process."""
    if redis is None:
        return {name: RateLimiter(rate, burst) for name, (rate, burst) in limits.items()}
    client = redis_client(redis)
    breaker = CircuitBreaker(
        "Redis", "rate limits are per process", redis.failures, redis.reset_after, on_open=on_open
    )
    return {
        name: SharedRateLimiter(client, breaker, name, rate, burst) for name, (rate, burst) in limits.items()
    }


def redis_client(options: RedisOptions) -> Any:
    """A redis-py client whose every call takes at most `options.timeout` to connect and as much
    to be answered, tried once (redis-py's retries would multiply the wait)."""
    import redis

    return redis.Redis.from_url(
        options.url,
        socket_timeout=options.timeout,
        socket_connect_timeout=options.timeout,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
