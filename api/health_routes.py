"""/healthz (process alive), /readyz (database reachable, schema current, master key opens the active
keys) and /metrics (auditor)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError

from wmark.api.deps import AdmittedRoute, AuditorToken, ServiceDep
from wmark.api.errors import AUTHENTICATED, documented, error_response
from wmark.api.metrics import CONTENT_TYPE_LATEST
from wmark.errors import KeyRegistryError
from wmark.keys import KeyRegistry
from wmark.keys.db import head_revision, schema_revision
from wmark.keys.sqlite_file import RegistryDamagedError

__all__ = ["router"]

router = APIRouter(route_class=AdmittedRoute, tags=["health"])


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, Any]:
    """The process is up (no database access)."""
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness", responses=documented(503))
async def readyz(service: ServiceDep) -> JSONResponse:
    """The database answers (within `WMARK_API_READY_TIMEOUT` seconds), its schema is this release's
    and the master key opens the active keys."""
    # Waits on the service's threads and gives up after `ready_timeout`: a probe of a database
    # that does not answer gets its 503 at once; the thread it leaves ends within the database's
    # own timeouts (wmark.keys.db_timeouts).
    timeout = service.settings.ready_timeout
    try:
        revision, head, master_key = await asyncio.wait_for(
            service.in_thread(lambda: _probe(service.registry)), timeout
        )
    except TimeoutError:
        return error_response(503, "not_ready", f"the database did not answer within {timeout:g} s")
    except RegistryDamagedError:  # its path and the driver's words are in the CLI's message
        return error_response(503, "not_ready", "the registry database is damaged")
    except (KeyRegistryError, SQLAlchemyError):
        return error_response(503, "not_ready", "the database is unreachable")
    if revision != head:
        return error_response(503, "not_ready", f"schema at {revision}, expected {head}: run wmark migrate")
    if master_key is not None:
        return error_response(503, "not_ready", master_key)
    return JSONResponse({"status": "ready", "schema": revision})


def _probe(registry: KeyRegistry) -> tuple[str | None, str, str | None]:
    """The schema's revision, this release's, and (schema current) why the master key cannot
    serve the active keys: cached by `MasterKeyHealth`, which decrypts only when they changed."""
    revision, head = schema_revision(registry.engine), head_revision()
    return revision, head, registry.master_key_health.problem() if revision == head else None


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}},
        **documented(*AUTHENTICATED),
    },
)
def metrics(_token: AuditorToken, service: ServiceDep) -> Response:
    """Requests, latency, verdicts and auth failures in the Prometheus text format."""
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
