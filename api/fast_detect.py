"""POST /v1/detect's fast door: the route's work without FastAPI's request handler.

FastAPI's handler of a route (reading and parsing the body, resolving the dependencies,
validating) costs a detection request ~0.2 ms of the event loop's CPU, against ~0.06 ms for all
the rest of the app (middlewares, routing, the route's own code; measured in one process with the
detection stubbed out, a text's `Detector.detect()` being ~1.3 ms). `FastDetectRoute` sits first
in the app's router, ahead of the FastAPI route, so every middleware of the app runs around it as
around any route (request metrics and their labels, the body limit, `X-Content-Type-Options`,
FastAPI's own, whatever is added later) and what it raises is answered by the app's exception
handlers.

It answers a request that carries a bearer token and whose body the FastAPI route would read
as JSON, find within the limits and admit as `DetectRequest` (the same `json.loads`, the same
`check_sizes` before the same model), by calling what that route calls: its dependencies
(`HONOURED`: `deps.get_service`; `deps.DETECTOR`, which is `admission.admit`: bearer token, one
Authorization header, role, rate limit, refusals audited; and `detect_routes.bounded_detect`,
whose `check_sizes` it ran on the body already), then `detect_one` and `json_response`. A
request without a token is passed on unread: the route refuses it before validating its body.
Every other request (one the route would refuse for its body, or read otherwise) is routed
again, body and all, to the FastAPI route, before anything with a side effect (rate limit,
audit row) happened; its answers, errors included, are FastAPI's.
The route stays registered, so /openapi.json documents it.

The door opens only for the route it was written for: `differences(app)` lists how the route of
the app as built differs from what the door does (a dependency or parameter added to the route,
its router or the app, or one gone; another endpoint for the path; a route body limit). Any
difference keeps the door shut (logged once), and so do dependency overrides: every request then
goes to the FastAPI route, slower, with the same answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import Match, Route, compile_path
from starlette.types import Message, Receive, Scope, Send

from wmark.api.admission import bearer
from wmark.api.deps import DETECTOR, get_service
from wmark.api.detect_routes import bounded_detect, check_sizes, detect, detect_one, json_response
from wmark.api.errors import TextTooLong
from wmark.api.schemas import DetectRequest
from wmark.api.settings import Settings

__all__ = ["HONOURED", "PATH", "FastDetectRoute", "differences"]

log = logging.getLogger("wmark.api")

PATH = "/v1/detect"
# The route's dependencies that the door honours: it calls each one, as FastAPI would.
HONOURED: frozenset[Callable[..., Any]] = frozenset({get_service, DETECTOR, bounded_detect})
_HANDED_ON = "wmark.handed_on"  # in the scope of a request the door passed on to the FastAPI route


class FastDetectRoute(Route):
    """The fast door of POST /v1/detect in `app`'s router, ahead of the FastAPI route."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(PATH, _Door(app), methods=["POST"], name="detect_fast_door", include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """POST /v1/detect, unless the door passed it on; anything else is the FastAPI routes' (a
        405 too)."""
        match, child_scope = super().matches(scope)
        if match is not Match.FULL or _HANDED_ON in scope:
            return Match.NONE, {}
        return match, {**child_scope, "route": self}  # the route template, as FastAPI's routes set it


class _Door:
    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._open: bool | None = None  # decided at the first request, when the app is complete

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._open is None:
            found = differences(self._app)
            self._open = not found
            if found:
                log.warning("POST %s: the fast door is shut; the route has %s", PATH, "; ".join(found))
        if not self._open or self._app.dependency_overrides:
            await self._hand_on(scope, receive, send)
            return
        if bearer(scope)[0] is None:  # refused before its body is looked at, by the route
            await self._hand_on(scope, receive, send)
            return
        service = await get_service(Request(scope))
        messages, body = await _read(receive)
        detect_request = _admissible(scope, body, service.settings) if body else None
        if detect_request is None:
            await self._hand_on(scope, _replaying(messages, receive), send)
            return
        request = Request(scope, receive)
        token = await DETECTOR(request)
        response = json_response(await detect_one(service, request, token, detect_request))
        await response(scope, receive, send)

    async def _hand_on(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route the request again, now to the FastAPI route."""
        scope[_HANDED_ON] = True
        await self._app.router(scope, receive, send)


async def _read(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The messages of the request body, and the body (None if the client left before its end)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        if not message.get("more_body", False):
            break
    if len(messages) == 1:
        return messages, message.get("body", b"")
    return messages, b"".join(m.get("body", b"") for m in messages)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives the messages already read, in order, then the client's."""
    pending = iter(messages)

    async def replay() -> Message:
        return next(pending, None) or await receive()

    return replay


def _admissible(scope: Scope, body: bytes, settings: Settings) -> DetectRequest | None:
    """The body as the FastAPI route reads it, or None where it would answer otherwise."""
    content_type = next((value for name, value in scope["headers"] if name == b"content-type"), None)
    if content_type is None or content_type.partition(b";")[0].strip().lower() != b"application/json":
        return None  # FastAPI's to decide: no media type, another one (`+json` too), ...
    try:
        decoded = json.loads(body)  # Request.json()
        check_sizes(settings, [decoded])  # bounded_detect
        return DetectRequest.model_validate(decoded)  # FastAPI's check
    except (ValueError, RecursionError, TextTooLong, ValidationError):  # JSON, nesting, size, schema
        return None


def differences(app: FastAPI) -> list[str]:
    """How the route that `app` gives POST /v1/detect differs from what the door does (empty:
    the door may answer for it)."""
    for context in iter_route_contexts(app.router.routes):
        route = context.original_route
        if isinstance(route, FastDetectRoute) or not context.path:
            continue
        if not compile_path(context.path)[0].match(PATH) or "POST" not in (context.methods or ()):
            continue
        if not isinstance(route, APIRoute) or context.endpoint is not detect:
            return [f"the route {context.name} at {context.path} is not detect_routes.detect"]
        calls: set[Callable[..., Any]] = set()
        found = list(_walk(context.dependant, calls, top=True))
        found += [f"the dependency {_name(call)}" for call in calls - HONOURED]
        found += [f"no dependency {_name(call)}, which the door calls" for call in HONOURED - calls]
        if context.max_body_size is not None:
            found.append(f"the route's max_body_size ({context.max_body_size})")
        return found
    return ["no FastAPI route for the path"]


def _walk(dependant: Dependant, calls: set[Callable[..., Any]], *, top: bool = False) -> Iterator[str]:
    """The parameters of `dependant` and its dependencies that the door would skip; the
    dependencies, all the way down, into `calls`."""
    for param in (
        *dependant.path_params,
        *dependant.query_params,
        *dependant.header_params,
        *dependant.cookie_params,
    ):
        yield f"the parameter {param.name}"
    bodies = [param.field_info.annotation for param in dependant.body_params]
    if bodies != ([DetectRequest] if top else []):
        yield f"the body {bodies}"
    for sub in dependant.dependencies:
        if sub.call is not None:
            calls.add(sub.call)
        yield from _walk(sub, calls)


def _name(call: Callable[..., Any]) -> str:
    return getattr(call, "__name__", None) or repr(call)
