"""POST /v1/detect without FastAPI's per-request machinery, when the request needs none of it.

Through the full stack, a detection request cost the event loop's thread 0.6-0.7 ms of CPU
(middlewares, routing, dependency resolution, validation; measured on a loaded machine, where the
detection itself took 1.0-1.5 ms); through this path 0.25-0.35 ms. `ServiceApp` answers the
common request itself: a JSON body within the size limit, exactly one `Authorization: Bearer`
header whose token is in the process's token cache with a role that may detect, a body that
`DetectRequest` admits as FastAPI would validate it (the same `json.loads`, the same model), and
a per-process rate limiter. It then does what the route does (rate limit, `detect_all` in the
service's threads, the orjson answer) and what the middlewares do (body limit and read timeout,
request metrics, `X-Content-Type-Options`); errors raised on the way get the app's own error
handlers.

Every other request, including every one that the full stack would refuse, is passed to the
FastAPI app with its body, before anything with a side effect (rate limit, audit row) happened:
its answers, errors included, are the app's by construction, and the route stays registered,
so /openapi.json still documents it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from wmark.api.deps import Service
from wmark.api.detect_routes import detect_one
from wmark.api.errors import RateLimited, exception_response
from wmark.api.limits import DISCONNECTED, RateLimiter, read_body, replaying
from wmark.api.schemas import DetectRequest
from wmark.keys.tokens import TokenInfo

__all__ = ["ServiceApp"]

PATH = "/v1/detect"
_NOSNIFF = (b"x-content-type-options", b"nosniff")  # what MetricsMiddleware adds to every answer


class ServiceApp(FastAPI):
    """The service's FastAPI app, with POST /v1/detect answered directly when it can be (above)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            service = getattr(self.state, "service", None)
            if isinstance(service, Service) and not self.dependency_overrides:
                await self._detect(service, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _detect(self, service: Service, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        settings = service.settings
        body = await read_body(
            scope, receive, send, settings.max_body_bytes, settings.body_timeout, (_NOSNIFF,)
        )
        if isinstance(body, int):  # answered (or the client left) as BodyLimitMiddleware does
            _count(service, body, started)
            return
        admitted = _admissible(service, scope, body)
        if admitted is None:
            await super().__call__(scope, replaying(body, receive), send)
            return
        token, request = admitted
        status = 500  # as MetricsMiddleware labels a request that ended without an answer
        try:
            status = await _answer(service, scope, send, token, request)
        finally:
            _count(service, status, started)


def _admissible(service: Service, scope: Scope, body: bytes) -> tuple[TokenInfo, DetectRequest] | None:
    """The cached token and the validated body, or None where the full app must decide.

    Nothing here has a side effect, so the app sees the request as if it came first.
    """
    if not body or not isinstance(service.limiter, RateLimiter):
        return None
    content_type: bytes | None = None
    authorization: bytes | None = None
    authorizations = 0
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorizations += 1
            authorization = value
        elif name == b"content-type" and content_type is None:  # the first, as Request.headers.get
            content_type = value
    if authorizations != 1 or authorization is None or content_type is None:
        return None
    if content_type.partition(b";")[0].strip().lower() != b"application/json":
        return None
    scheme, _, credentials = authorization.decode("latin-1").partition(" ")  # as HTTPBearer parses
    token = credentials.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    info = service.token_cache.cached(token)
    if info is None or not info.allows("detector"):
        return None
    try:
        request = DetectRequest.model_validate(json.loads(body))  # Request.json(), then FastAPI's check
    except (ValueError, RecursionError, ValidationError):  # JSON, encoding, nesting, schema
        return None
    return info, request


async def _answer(service: Service, scope: Scope, send: Send, token: TokenInfo, body: DetectRequest) -> int:
    """What the route answers, and its status."""
    request = Request(scope)
    try:
        wait = service.limiter.acquire(token.token_id)
        if wait > 0:
            raise RateLimited(wait)
        answer = await detect_one(service, request, token, body)
    except Exception as exc:  # the app's handlers shape it; unexpected ones are logged there
        error = await exception_response(request, exc)
        await _send(send, error.status_code, bytes(error.body), error.raw_headers)
        return error.status_code
    content = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = [(b"content-length", str(len(content)).encode("ascii")), (b"content-type", b"application/json")]
    await _send(send, 200, content, headers)
    return 200


async def _send(send: Send, status: int, content: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": [*headers, _NOSNIFF]}
    await send(start)
    await send({"type": "http.response.body", "body": content})


def _count(service: Service, status: int, started: float) -> None:
    """The request metrics, as MetricsMiddleware records them (499: the client left mid-body)."""
    label = "499" if status == DISCONNECTED else str(status)
    service.metrics.requests.labels("POST", PATH, label).inc()
    service.metrics.latency.labels("POST", PATH).observe(time.perf_counter() - started)
