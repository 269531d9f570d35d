"""/v1/audit (auditor): page through the audit log, and verify its hash chain."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from wmark.api.deps import AdmittedRoute, AuditorToken, ServiceDep
from wmark.api.errors import AUTHENTICATED, documented
from wmark.api.schemas import AuditPage, VerifyOut

__all__ = ["router"]

router = APIRouter(
    route_class=AdmittedRoute, prefix="/v1/audit", tags=["audit"], responses=documented(*AUTHENTICATED)
)


@router.get("", response_model=AuditPage, summary="Read the audit log, newest first")
def read_audit(
    _token: AuditorToken,
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**62, description="Only rows with seq < before.")] = None,
    action: Annotated[str | None, Query(pattern=r"^[a-z_]{1,32}$")] = None,
) -> dict[str, Any]:
    """Audit rows newest first; pass `next_before` back as `before` for the next page."""
    rows = service.registry.audit.page(limit=limit, before=before, action=action)
    return {
        "events": [r.to_dict() for r in rows],
        "next_before": rows[-1].seq if len(rows) == limit else None,
    }


@router.get("/verify", response_model=VerifyOut, summary="Verify the hash chain")
def verify_audit(_token: AuditorToken, service: ServiceDep) -> dict[str, Any]:
    """Replay the whole chain; `first_bad_seq` names the first edited, deleted or moved row."""
    return service.registry.audit.verify().to_dict()
