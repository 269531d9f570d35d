"""Request dependencies: the service state, and the admission of authenticated routes by role.

`require(role)` is the dependency of a route open to `role`: it calls `admission.admit`, the one
place where bearer tokens, roles and rate limits are checked (and refusals audited), and it is
documented in OpenAPI as the `HTTPBearer` security scheme.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.routing import APIRoute
from fastapi.security.base import SecurityBase
from starlette.concurrency import run_in_threadpool

from wmark.api.admission import admit, admitted, recheck
from wmark.api.calibration_states import CalibrationStates
from wmark.api.detectors import DetectorCache
from wmark.api.limits import RateLimiter
from wmark.api.metrics import Metrics
from wmark.api.settings import Settings
from wmark.api.shared_limits import SharedRateLimiter
from wmark.api.token_cache import TokenCache
from wmark.keys import KeyRegistry
from wmark.keys.tokens import Role, TokenInfo

__all__ = [
    "DETECTOR",
    "AdmittedRoute",
    "AdminToken",
    "AuditorToken",
    "DetectorToken",
    "RoleRequired",
    "decoded_body",
    "Service",
    "ServiceDep",
    "get_service",
    "refusal_before_error",
    "require",
]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Service:
    """What the routes share, built once per process in the app's lifespan."""

    settings: Settings
    registry: KeyRegistry
    detectors: DetectorCache
    limiter: RateLimiter | SharedRateLimiter
    auth_limiter: RateLimiter | SharedRateLimiter
    metrics: Metrics
    token_cache: TokenCache
    executor: ThreadPoolExecutor
    calibration_states: CalibrationStates

    async def in_thread(self, work: Callable[[], T]) -> T:
        """Run blocking work (detection, database writes) on the service's threads.

        A plain executor hop: FastAPI's for `def` endpoints goes through anyio (capacity
        limiter, cancel scopes), ~0.1 ms of CPU more per request. The pool's size bounds the
        requests in progress as anyio's default limiter (40) did.
        """
        return await asyncio.get_running_loop().run_in_executor(self.executor, work)


async def get_service(request: Request) -> Service:
    """The service state of the app handling `request` (async: no thread-pool hop, no I/O)."""
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


class RoleRequired(SecurityBase):
    """The dependency of a route open to `role`: `admission.admit` (see there), which raises
    401, 403 or 429; OpenAPI documents it as the `HTTPBearer` scheme."""

    def __init__(self, role: Role, *, cached: bool) -> None:
        self.model = HTTPBearerModel(description="An API token from `wmark tokens create --role ROLE`.")
        self.scheme_name = "HTTPBearer"
        self.role: Role = role
        self.cached = cached

    async def __call__(self, request: Request) -> TokenInfo:
        found = admitted(request)  # by `AdmittedRoute`, before the body was read
        if found is not None:
            return found[0]
        return await admit(await get_service(request), request, self.role, cached=self.cached)


def require(role: Role, *, cached: bool = False) -> RoleRequired:
    """The dependency that admits a valid token allowed to act as `role`, within its rate limit.

    `cached`: take the token from the process's `TokenCache`; only for routes that re-check
    revocation in the transaction of their audit row (the detection routes).
    """
    return RoleRequired(role, cached=cached)


async def decoded_body(request: Request) -> object:
    """The body as FastAPI decoded it (Starlette keeps it), or None where it is not JSON: for
    dependencies that bound a request's work before FastAPI validates its body."""
    try:
        return await request.json()
    except (ValueError, RecursionError):  # not JSON: the route's validation answers it
        return None


class AdmittedRoute(APIRoute):
    """An `APIRoute` whose request is admitted (its `RoleRequired` dependency) before anything else.

    FastAPI reads and decodes a body before it resolves a route's dependencies: an anonymous
    request would be told its body did not parse, and a 1 MiB body of small JSON values cost
    ~0.3 s of the event loop to decode before its 401 (the collector walks every object of the
    process while the decoder makes 350,000). Here the admission runs first, and the
    dependency, when FastAPI resolves it, returns what it admitted (`admitted`).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        role = _role_of(self.dependant)

        async def admitted_first(request: Request) -> Response:
            if role is not None and role not in request.app.dependency_overrides:
                await role(request)
            return await handle(request)

        return admitted_first


def _role_of(dependant: Dependant) -> RoleRequired | None:
    """The admission dependency among `dependant`'s, all the way down (None if it has none)."""
    for sub in dependant.dependencies:
        if isinstance(sub.call, RoleRequired):
            return sub.call
        if (found := _role_of(sub)) is not None:
            return found
    return None


async def refusal_before_error(request: Request) -> None:
    """Raise the refusal (401; audited as at the door) of a token admitted from the `TokenCache`
    that was revoked since: the app's handlers answer it instead of a client error (`errors`).

    Such a token is checked for revocation only where its route writes its audit row, which an
    error is answered before; so its revocation is checked in the database now (one query, on
    the error path only), and a revoked token learns nothing more (not which keys exist).
    """
    found = admitted(request)
    if found is not None and found[1]:
        await run_in_threadpool(recheck, await get_service(request), request, found[0])


DETECTOR = require("detector", cached=True)  # also called by the fast door of POST /v1/detect
DetectorToken = Annotated[TokenInfo, Depends(DETECTOR)]
AdminToken = Annotated[TokenInfo, Depends(require("admin"))]
AuditorToken = Annotated[TokenInfo, Depends(require("auditor"))]
