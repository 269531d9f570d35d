"""Rate limits shared by every worker and process of the service, kept in Redis.

With `WMARK_REDIS_URL` set, each API token's (and each client address's failed-authentication)
token bucket lives in Redis and is updated by one Lua script, atomically, with Redis's clock: N
workers, or N machines, give a token its configured rate once, not N times. Without Redis the
buckets are per process (`RateLimiter`). If Redis stops answering, requests are limited per
process until it is back (rate limiting protects the service; it must not take it down).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from wmark.api.limits import RateLimiter

__all__ = ["SharedRateLimiter", "rate_limiter"]

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
_WARN_EVERY_S = 60.0


class SharedRateLimiter:
    """Token buckets by key in Redis; the same `acquire` as `RateLimiter`.

    Args:
        url: Redis URL (redis://host:port/db).
        namespace: prefix of this limiter's keys (one limiter per purpose).
        rate, burst: as for `RateLimiter`.
    """

    def __init__(self, url: str, namespace: str, rate: float, burst: int) -> None:
        import redis

        self._client: Any = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._script = self._client.register_script(_TOKEN_BUCKET)
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._namespace = namespace
        self._args = (repr(float(rate)), str(int(burst)))
        self.fallback = RateLimiter(rate, burst)
        self._warned_at = -_WARN_EVERY_S

    def acquire(self, key: str) -> float:
        """Take one token for `key`: 0.0 if allowed, else the seconds until one is available."""
        try:
            return float(self._script(keys=[f"wmark:rate:{self._namespace}:{key}"], args=self._args))
        except self._errors as exc:
            now = time.monotonic()
            if now - self._warned_at >= _WARN_EVERY_S:
                self._warned_at = now
                log.warning("Redis unavailable (%s): rate limits are per process", type(exc).__name__)
            return self.fallback.acquire(key)


def rate_limiter(
    redis_url: str | None, namespace: str, rate: float, burst: int
) -> RateLimiter | SharedRateLimiter:
    """A limiter shared through Redis when `redis_url` is set, else one for this process."""
    if redis_url:
        return SharedRateLimiter(redis_url, namespace, rate, burst)
    return RateLimiter(rate, burst)
