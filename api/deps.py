"""Request dependencies: the service state, bearer-token authentication, roles and rate limits.

Every rejected request (no token, bad token, wrong role) is written to the audit log as
`auth_failed`, unless its client address is past the failed-authentication rate limit (then it is
answered 429 and only counted in the metrics, so a flood cannot fill the log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, NoReturn, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from wmark.api.detectors import DetectorCache
from wmark.api.errors import Forbidden, RateLimited
from wmark.api.limits import RateLimiter
from wmark.api.metrics import Metrics
from wmark.api.settings import Settings
from wmark.api.shared_limits import SharedRateLimiter
from wmark.api.token_cache import TokenCache
from wmark.keys import KeyRegistry
from wmark.keys.audit import AuditEntry
from wmark.keys.tokens import Role, TokenInfo, TokenRejected

__all__ = ["AdminToken", "AuditorToken", "DetectorToken", "Service", "ServiceDep", "get_service", "reject"]

log = logging.getLogger("wmark.api")
T = TypeVar("T")

_bearer = HTTPBearer(auto_error=False, description="An API token from `wmark tokens create --role ROLE`.")


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


def reject(
    service: Service, request: Request, reason: str, token_id: str | None, error: Exception
) -> NoReturn:
    """Count, audit (within the failed-authentication rate limit) and raise a refusal."""
    service.metrics.auth_failures.labels(reason).inc()
    client = request.client.host if request.client else "unknown"
    wait = service.auth_limiter.acquire(client)
    if wait > 0:
        raise RateLimited(wait) from None
    log.info("rejected %s %s: %s (token id %s)", request.method, request.url.path, reason, token_id or "-")
    service.registry.audit.append(
        AuditEntry(
            actor=f"token:{token_id}" if token_id else "anonymous",
            action="auth_failed",
            result={
                "reason": reason,
                "status": 403 if isinstance(error, Forbidden) else 401,
                "method": request.method,
                "path": request.url.path[:200],
                "client": client,
            },
        )
    )
    raise error


def require(role: Role, *, cached: bool = False) -> Callable[..., Awaitable[TokenInfo]]:
    """A dependency that admits a valid token allowed to act as `role`, within its rate limit.

    `cached`: take the token from the process's `TokenCache`; only for routes that re-check
    revocation in the transaction of their audit row (the detection routes). A cached token
    within a per-process rate limit is admitted on the event loop (no I/O, no thread-pool hop:
    ~0.2 ms of CPU less per request); anything that may touch the database or Redis runs in
    the thread pool.
    """

    def admit(request: Request, service: Service, token: str | None) -> TokenInfo:
        try:
            if len(request.headers.getlist("authorization")) > 1:
                # proxies and frameworks disagree on which of two headers counts: accept neither
                raise TokenRejected("ambiguous")
            info = (service.token_cache if cached else service.registry.tokens).authenticate(token)
        except TokenRejected as exc:
            reject(service, request, exc.reason, exc.token_id, exc)
        if not info.allows(role):
            reject(
                service,
                request,
                "forbidden",
                info.token_id,
                Forbidden(f"this token's role ({info.role}) may not do this; it needs {role}"),
            )
        wait = service.limiter.acquire(info.token_id)
        if wait > 0:
            raise RateLimited(wait)
        return info

    async def dependency(
        request: Request,
        service: ServiceDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> TokenInfo:
        token = credentials.credentials if credentials is not None else None
        if cached and isinstance(service.limiter, RateLimiter):
            info = service.token_cache.cached(token)
            if info is not None and info.allows(role) and len(request.headers.getlist("authorization")) == 1:
                wait = service.limiter.acquire(info.token_id)
                if wait > 0:
                    raise RateLimited(wait)
                return info
        return await run_in_threadpool(admit, request, service, token)

    dependency.__name__ = f"require_{role}"
    return dependency


DetectorToken = Annotated[TokenInfo, Depends(require("detector", cached=True))]
AdminToken = Annotated[TokenInfo, Depends(require("admin"))]
AuditorToken = Annotated[TokenInfo, Depends(require("auditor"))]
