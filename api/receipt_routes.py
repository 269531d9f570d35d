"""GET /v1/receipts/keys: the public keys that verify detection receipts (JWKS), open to all.

A receipt is worth what its verifier's copy of these keys is: third parties fetch the set here
(or from `wmark receipt keys --json`) and verify offline. Revoked and retired keys stay in it,
marked, so that a receipt of a revoked key fails saying why; the short cache lifetime bounds how
long a verifier may go on trusting a key revoked since.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from wmark.api.deps import AdmittedRoute, ServiceDep
from wmark.api.detect_routes import json_response
from wmark.api.schemas import ReceiptKeySet

__all__ = ["router"]

router = APIRouter(route_class=AdmittedRoute, prefix="/v1/receipts", tags=["receipts"])

CACHE_SECONDS = 60


@router.get("/keys", response_model=ReceiptKeySet, summary="Public keys of detection receipts (JWKS)")
def receipt_keys(service: ServiceDep) -> Response:
    """Every signing key as an Ed25519 JWK with its `kid` (RFC 7638 thumbprint) and `status`
    ("active", "retired" or "revoked", with `revoked_at`); verify receipts against this set."""
    response = json_response(service.registry.receipt_keys.jwks())
    response.headers["Cache-Control"] = f"public, max-age={CACHE_SECONDS}"
    return response
