"""Request limits: a bounded request body read in bounded time (413, 408) and token-bucket rate limits (429).

`RateLimiter` lives in one worker process: with N workers a client can get up to N times the
configured rate. With `WMARK_REDIS_URL` set the service uses `shared_limits.SharedRateLimiter`
instead, one bucket per token across every worker and process.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DISCONNECTED", "BodyLimitMiddleware", "RateLimiter", "read_body", "replaying"]


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
    """Reads at most `max_bytes` of a request body within `read_timeout` seconds, then replays it
    to the app.

    More bytes are a 413 (Content-Length is checked first, chunked bodies as they arrive); a
    Content-Length that is not a number is a 400; a body that has not fully arrived after
    `read_timeout` seconds is a 408 and the connection is closed, so stalled clients cannot hold
    connections (and their buffers) open. A client that disconnects mid-body gets no answer.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, send, self.max_bytes, self.read_timeout)
        if isinstance(body, int):
            return
        await self.app(scope, replaying(body, receive), send)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, whole, then the client's messages."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


DISCONNECTED = 499  # what `read_body` returns for a client gone mid-body (nginx's "client closed request")


async def read_body(
    scope: Scope, receive: Receive, send: Send, max_bytes: int, read_timeout: float
) -> bytes | int:
    """The request body, or the status already answered (400, 413, 408; `DISCONNECTED` when the
    client left and nothing was answered): the checks of `BodyLimitMiddleware`."""
    declared = dict(scope.get("headers", ())).get(b"content-length")
    if declared is not None and not declared.isdigit():
        await _answer(send, 400, "bad_request", "Content-Length is not a number")
        return 400
    # leading zeros are legal (llhttp passes them), and past 4,300 digits int() refuses the text
    if declared is not None and _too_large(declared.lstrip(b"0"), max_bytes):
        await _answer(send, 413, "body_too_large", f"request body is over {max_bytes} bytes")
        return 413
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(read_timeout) as timer:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return DISCONNECTED
            body = message.get("body", b"")
            size += len(body)
            if size > max_bytes:
                await _answer(send, 413, "body_too_large", f"request body is over {max_bytes} bytes")
                return 413
            chunks.append(body)
            if not message.get("more_body", False):
                break
    if timer.cancelled_caught:
        await _answer(send, 408, "request_timeout", f"the body did not arrive within {read_timeout:g} s")
        return 408
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(digits: bytes, max_bytes: int) -> bool:
    """Whether a Content-Length's digits (leading zeros stripped) count more than `max_bytes`."""
    return len(digits) > len(str(max_bytes)) or int(digits or b"0") > max_bytes


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    """An error in the service's JSON shape, before the app ran; the connection is closed after it."""
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
