"""Admission: whether a request may use an authenticated route, decided in one place.

`admit` is the whole of it, and every authenticated route calls it: through the route's FastAPI
dependency (`deps.require(role)`), and for POST /v1/detect also from its fast door
(`fast_detect`), which calls that same dependency. In order: the bearer token of exactly one
`Authorization` header (two or more are refused, whatever they hold: proxies and frameworks
disagree on which one counts), the token (from the process's `TokenCache` on the routes that
re-check revocation in their audit transaction, else from the database), its role, then its rate
limit (`limits.RateLimiter` per process, or `shared_limits.SharedRateLimiter` in Redis).

A refusal is raised as the error that the app's handlers answer: 401 (`TokenRejected`, with
WWW-Authenticate) or 403 (`Forbidden`), each counted in `wmark_auth_failures` by reason and
written to the audit log as `auth_failed`, unless the client address is past the
failed-authentication rate limit: then 429 and only counted, so a flood cannot fill the log; and
429 (`RateLimited`, with Retry-After) for a token past its own limit.

A cached token within a per-process rate limit is admitted on the event loop (no I/O, no
thread-pool hop: ~0.2 ms of CPU less per request); anything that may touch the database, the
audit log or Redis runs in the thread pool. Its revocation is re-checked where the route writes
its audit row, and, for an answer that writes none (an error), by `recheck` before that answer
(`deps.refusal_before_error`). Admission runs before the body is read (`deps.AdmittedRoute`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NoReturn

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import Scope

from wmark.api.access_log import redact
from wmark.api.errors import Forbidden, RateLimited
from wmark.api.limits import RateLimiter
from wmark.keys.audit import AuditEntry
from wmark.keys.tokens import Role, TokenInfo, TokenRejected, TokenStore

if TYPE_CHECKING:  # deps builds its dependencies on `admit`
    from wmark.api.deps import Service

__all__ = ["admit", "admitted", "bearer", "recheck", "reject"]

log = logging.getLogger("wmark.api")


async def admit(service: Service, request: Request, role: Role, *, cached: bool) -> TokenInfo:
    """The request's token, allowed to act as `role` and within its rate limit; else raises (above).

    `cached`: take the token from the process's `TokenCache`; only for routes that re-check
    revocation in the transaction of their audit row (the detection routes).
    """
    token, headers = bearer(request.scope)
    if cached and headers == 1 and isinstance(service.limiter, RateLimiter):
        info = service.token_cache.cached(token)
        if info is not None and info.allows(role):
            return _admitted(request, _within_rate(service, info), cached=True)
    info = await run_in_threadpool(_admit, service, request, role, token, headers, cached)
    return _admitted(request, info, cached=cached)


def _admitted(request: Request, info: TokenInfo, *, cached: bool) -> TokenInfo:
    request.state.wmark_admitted = (info, cached)
    return info


def admitted(request: Request) -> tuple[TokenInfo, bool] | None:
    """The token `admit` let this request in with, and whether it came from the `TokenCache`
    (whose revocation only the audit transaction re-checks); None if it was not admitted."""
    found: tuple[TokenInfo, bool] | None = getattr(request.state, "wmark_admitted", None)
    return found


def recheck(service: Service, request: Request, info: TokenInfo) -> None:
    """Refuse (as `reject` does) a token admitted from the cache that was revoked since: for the
    answers that write no audit row, whose transaction would have checked it (I/O: in a thread)."""
    with service.registry.tokens.sessions() as session:
        try:
            TokenStore.ensure_unrevoked(session, info.token_id)
        except TokenRejected as exc:
            service.token_cache.forget(info.token_id)
            reject(service, request, exc.reason, exc.token_id, exc)


def bearer(scope: Scope) -> tuple[str | None, int]:
    """The request's bearer token, as `fastapi.security.HTTPBearer` reads it (from the first
    `Authorization` header: scheme `Bearer` in any case, the credentials after the first space,
    stripped; None if there is none), and how many `Authorization` headers the request has."""
    token: str | None = None
    headers = 0
    for name, value in scope["headers"]:
        if name == b"authorization":
            headers += 1
            if headers == 1:
                scheme, _, credentials = value.decode("latin-1").partition(" ")
                credentials = credentials.strip()
                if scheme.lower() == "bearer" and credentials:
                    token = credentials
    return token, headers


def _admit(
    service: Service, request: Request, role: Role, token: str | None, headers: int, cached: bool
) -> TokenInfo:
    """`admit` where it may do I/O (the database, the audit log, Redis): in the thread pool."""
    try:
        if headers > 1:
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
    return _within_rate(service, info)


def _within_rate(service: Service, info: TokenInfo) -> TokenInfo:
    wait = service.limiter.acquire(info.token_id)
    if wait > 0:
        raise RateLimited(wait)
    return info


def reject(
    service: Service, request: Request, reason: str, token_id: str | None, error: Exception
) -> NoReturn:
    """Count, audit (within the failed-authentication rate limit) and raise a refusal."""
    service.metrics.auth_failures.labels(reason).inc()
    client = request.client.host if request.client else "unknown"
    wait = service.auth_limiter.acquire(client)
    if wait > 0:
        raise RateLimited(wait) from None
    # a token pasted into the path must not reach the log or the audit row (auditors read it)
    path = redact(request.url.path)
    log.info("rejected %s %s: %s (token id %s)", request.method, path, reason, token_id or "-")
    service.registry.audit.append(
        AuditEntry(
            actor=f"token:{token_id}" if token_id else "anonymous",
            action="auth_failed",
            result={
                "reason": reason,
                "status": 403 if isinstance(error, Forbidden) else 401,
                "method": request.method,
                "path": path[:200],
                "client": client,
            },
        )
    )
    raise error
