"""Request limits: a bounded request body (413) and token-bucket rate limits (429).

The rate limiter lives in each worker process: with N workers a client can get up to N times
the configured rate. That keeps a database round trip off every request; size the limit per
worker.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimitMiddleware", "RateLimiter"]


class RateLimiter:
    """Token buckets by key (an API token id, or a client address).

    Args:
        rate: tokens added per second.
        burst: bucket size (requests allowed at once after a quiet spell).
        max_keys: buckets kept; the least recently used ones are dropped (they are full again by then).
    """

    def __init__(self, rate: float, burst: int, *, max_keys: int = 10_000) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """Take one token for `key`: 0.0 if allowed, else the seconds until one is available."""
        now = time.monotonic()
        with self._lock:
            level, then = self._buckets.pop(key, (self.burst, now))
            level = min(self.burst, level + (now - then) * self.rate)
            wait = 0.0
            if level >= 1.0:
                level -= 1.0
            else:
                wait = (1.0 - level) / self.rate
            self._buckets[key] = (level, now)
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
            return wait


class BodyLimitMiddleware:
    """Reads at most `max_bytes` of a request body, then replays it to the app; more is a 413.

    Checks Content-Length first, and counts chunked bodies as they arrive.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {"code": "body_too_large", "message": f"request body is over {self.max_bytes} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
