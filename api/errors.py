"""Errors as JSON `{"code", "message"}` with the right 4xx; anything unexpected is a logged 500.

`WmarkError` subclasses carry their own `code` and `status`; validation errors are 422, bodies
over the limit 413, rate limits 429 (with Retry-After), bad tokens 401 (with WWW-Authenticate),
wrong roles 403, an unreachable database 503. The user's input is never echoed into an error message.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from wmark.api.route_match import matching_routes
from wmark.api.schemas import ErrorOut
from wmark.errors import AuthError, InputError, WmarkError
from wmark.keys.tokens import TokenRejected

__all__ = [
    "AUTHENTICATED",
    "DATABASE_UNAVAILABLE",
    "BodyTooLarge",
    "Forbidden",
    "RateLimited",
    "TextTooLong",
    "documented",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger("wmark.api")

_HTTP_CODES = {
    400: "bad_request",
    408: "request_timeout",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "body_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


class Forbidden(AuthError):
    """The token is valid but its role may not do this."""

    code = "forbidden"
    status = 403


class RateLimited(WmarkError):
    """Too many requests from this token (or failed authentications from this address)."""

    code = "rate_limited"
    status = 429

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limit exceeded; retry in {retry_after:.1f} s")
        self.retry_after = retry_after


class BodyTooLarge(WmarkError):
    """The request body is over the configured limit."""

    code = "body_too_large"
    status = 413


class TextTooLong(InputError):
    """A text, token-ID list or batch is over the configured limit."""

    code = "text_too_long"
    status = 413


_WHY = {
    400: "Malformed request (e.g. a bad Content-Length).",
    401: "Missing, malformed, unknown or revoked token, or more than one Authorization header.",
    403: "The token's role may not do this.",
    404: "No such key (or tokenizer).",
    408: "The request body did not arrive in time.",
    409: "The key is revoked (or otherwise in the wrong state).",
    413: "The body, a text, a batch or the response would be over the configured limits.",
    422: "The request does not match the schema, or the input cannot be scored.",
    429: "Rate limit exceeded; retry after Retry-After seconds.",
    503: "The database is unreachable, or the audit log is damaged (answers are not given unaudited).",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "The auth scheme (Bearer)."}},
    429: {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
}


# what any request with a token can be answered besides its success (body limits, auth, rate, database)
AUTHENTICATED = (400, 401, 403, 408, 413, 422, 429, 503)


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the `{code, message}` schema, so that
    generated clients know every status an operation can answer."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"model": ErrorOut, "description": _WHY[status]}
        if status in _HEADERS:
            out[status]["headers"] = _HEADERS[status]
    return out


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The one error shape of the service."""
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=dict(headers or {}))


def _headers(exc: WmarkError) -> dict[str, str]:
    if isinstance(exc, TokenRejected):
        return {"WWW-Authenticate": 'Bearer realm="wmark"'}
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(max(1, round(exc.retry_after + 0.5)))}
    return {}


async def _wmark_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WmarkError)  # registered for WmarkError only
    if exc.status >= 500:
        log.error("server-side error: %s: %s", type(exc).__name__, exc)
    return error_response(exc.status, exc.code, str(exc), _headers(exc))


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors()[:5]:  # never echo `input`: it may be a long text
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return error_response(422, "validation_error", "; ".join(parts) or "invalid request")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # the router names the methods of one route; the path may have more
        methods = set().union(*(m for _, m in matching_routes(request.scope)))
        headers["Allow"] = ", ".join(sorted(methods))
    return error_response(exc.status_code, code, str(exc.detail), headers)


DATABASE_UNAVAILABLE = (503, "database_unavailable", "the database is unavailable; try again later")
"""(status, code, message) of a database that did not answer: the driver's message can hold SQL
and parameters, so it is logged, never returned (a stream's error event says the same)."""


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("database error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(*DATABASE_UNAVAILABLE)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error (logged on the server)")


_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[JSONResponse]]] = {
    WmarkError: _wmark_error,
    RequestValidationError: _validation_error,
    StarletteHTTPException: _http_error,
    OperationalError: _database_error,
    PoolTimeout: _database_error,  # every connection of the pool busy (waiting on a slow database)
    Exception: _unexpected,
}


Gate = Callable[[Request], Awaitable[None]]


def install_error_handlers(app: FastAPI, *, gate: Gate | None = None) -> None:
    """Register the handlers that give every error the `{code, message}` shape.

    `gate`: awaited before a client error (4xx) other than a refusal is answered; an error it
    raises is answered instead (`deps.refusal_before_error`: a token revoked since it was cached
    is refused, whatever else its request met).
    """
    for kind, handler in _HANDLERS.items():
        if gate is not None and kind is not Exception:  # a 500 is not the client's doing
            handler = _gated(handler, gate)
        app.add_exception_handler(kind, handler)


def _gated(
    handler: Callable[[Request, Exception], Awaitable[JSONResponse]], gate: Gate
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def answer(request: Request, exc: Exception) -> JSONResponse:
        if _status(exc) < 500 and not isinstance(exc, AuthError | RateLimited):
            try:
                await gate(request)
            except Exception as refusal:  # noqa: BLE001 - answered by its own handler (500s logged)
                return await _handler_of(refusal)(request, refusal)
        return await handler(request, exc)

    return answer


def _status(exc: Exception) -> int:
    if isinstance(exc, WmarkError):
        return exc.status
    if isinstance(exc, StarletteHTTPException):
        return exc.status_code
    return 422 if isinstance(exc, RequestValidationError) else 500


def _handler_of(exc: Exception) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    return next(_HANDLERS[kind] for kind in type(exc).__mro__ if kind in _HANDLERS)
