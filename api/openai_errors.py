"""OpenAI's error shape on the OpenAI-compatible routes.

The service answers every error as `{"code", "message"}`; OpenAI clients expect
`{"error": {"message", "type", "code", "param"}}` and raise their own exception types from the
status. This middleware rewrites the error responses of the routes under `paths` (whatever
raised them: authentication, rate and body limits, validation, the routes), and answers a
validation error 400 as OpenAI does instead of 422. Other routes and successful responses
(streams included) pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["OpenAIErrorMiddleware", "error_type"]


def error_type(status: int) -> str:
    """OpenAI-style error type of an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class OpenAIErrorMiddleware:
    """Reshapes JSON error bodies of requests to `paths` into OpenAI's error object."""

    def __init__(self, app: ASGIApp, paths: Collection[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the whole body is here
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status, body = _reshape(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)


def _reshape(status: int, body: bytes) -> tuple[int, bytes]:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "code" in parsed and "message" in parsed:
        code, message = str(parsed["code"]), str(parsed["message"])
    else:
        code, message = "http_error", body.decode("utf-8", "replace")[:500]
    if status == 422:
        status = 400  # OpenAI answers malformed requests 400
    error = {"message": message, "type": error_type(status), "code": code, "param": None}
    return status, json.dumps({"error": error}).encode()
