"""Request dependencies: the service state, and the admission of authenticated routes by role.

`require(role)` is the dependency of a route open to `role`: it calls `admission.admit`, the one
place where bearer tokens, roles and rate limits are checked (and refusals audited), and it is
documented in OpenAPI as the `HTTPBearer` security scheme.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from wmark.api.admission import admit
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
    "AdminToken",
    "AuditorToken",
    "DetectorToken",
    "RoleRequired",
    "Service",
    "ServiceDep",
    "get_service",
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
        return await admit(await get_service(request), request, self.role, cached=self.cached)


def require(role: Role, *, cached: bool = False) -> RoleRequired:
    """The dependency that admits a valid token allowed to act as `role`, within its rate limit.

    `cached`: take the token from the process's `TokenCache`; only for routes that re-check
    revocation in the transaction of their audit row (the detection routes).
    """
    return RoleRequired(role, cached=cached)


DETECTOR = require("detector", cached=True)  # also called by the fast door of POST /v1/detect
DetectorToken = Annotated[TokenInfo, Depends(DETECTOR)]
AdminToken = Annotated[TokenInfo, Depends(require("admin"))]
AuditorToken = Annotated[TokenInfo, Depends(require("auditor"))]
