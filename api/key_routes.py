"""/v1/keys (admin): list, create, show, rotate and revoke; /v1/vllm-keys: register a vLLM deployment's
key. Secrets never appear here.

Key changes are audited by the registry in the same transaction, with the token as the actor.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query

from wmark.api.deps import AdminToken, AdmittedRoute, ServiceDep
from wmark.api.errors import AUTHENTICATED, documented
from wmark.api.schemas import KeyCreate, KeyDetail, KeyList, KeyPublic, VllmKeyCreate, VllmKeyCreated
from wmark.vllm_gumbel import GUESSABLE_WARNING, VllmWatermarkConfig

__all__ = ["router", "vllm_router"]

router = APIRouter(
    route_class=AdmittedRoute,
    prefix="/v1/keys",
    tags=["keys"],
    responses=documented(*AUTHENTICATED, 404, 409),
)
vllm_router = APIRouter(
    route_class=AdmittedRoute,
    prefix="/v1/vllm-keys",
    tags=["keys"],
    responses=documented(*AUTHENTICATED, 404, 409),
)

KeyIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="The key's id.")]


@router.get("", response_model=KeyList, summary="List keys")
def list_keys(
    _token: AdminToken,
    service: ServiceDep,
    status: Annotated[Literal["active", "retired", "revoked"] | None, Query()] = None,
) -> dict[str, Any]:
    """Keys, oldest first, optionally of one status."""
    return {"keys": [k.to_dict() for k in service.registry.list_keys(status)]}


@router.post("", response_model=KeyPublic, status_code=201, summary="Create a key")
def create_key(body: KeyCreate, token: AdminToken, service: ServiceDep) -> dict[str, Any]:
    """Create an active key with a fresh secret, bound to a tokenizer already in the registry."""
    info = service.registry.create_key(
        body.name,
        service.registry.tokenizer_ref(body.tokenizer_sha256),  # 404 if it is not stored
        context_width=body.context_width,
        context_mode=body.context_mode,
        min_scored_tokens=body.min_scored_tokens,
        actor=token.actor,
    )
    return info.to_dict()


# Not under /v1/keys/: GET /v1/keys/{key_id} would match its path too (and OPTIONS would offer GET).
@vllm_router.post(
    "",
    response_model=VllmKeyCreated,
    response_model_exclude_unset=True,  # `warnings` only where there are some
    status_code=201,
    summary="Register a vLLM deployment's key",
)
def create_vllm_key(body: VllmKeyCreate, token: AdminToken, service: ServiceDep) -> dict[str, Any]:
    """Register the key of a vLLM deployment's `--watermark-config`, to detect vLLM's native
    watermark (as `wmark keys create --scheme vllm-...`). The config's secret key is sealed under
    the master key and never returned; the creation is audited with the token as the actor."""
    config = VllmWatermarkConfig.from_dict(body.watermark_config.model_dump())
    info = service.registry.import_vllm_key(
        body.name,
        service.registry.tokenizer_ref(body.tokenizer_sha256),  # 404 if it is not stored
        config,
        min_scored_tokens=body.min_scored_tokens,
        actor=token.actor,
    )
    return info.to_dict() | ({"warnings": [GUESSABLE_WARNING]} if config.guessable else {})


@router.get("/{key_id}", response_model=KeyDetail, summary="Show a key and its calibration")
def show_key(key_id: KeyIdPath, _token: AdminToken, service: ServiceDep) -> dict[str, Any]:
    """One key's public view, and its newest calibration (`wmark calibrate`: its false-positive
    rate on the user's own text, with the corpus's hash and the date), null if it has none."""
    calibration = service.registry.calibrations.latest(key_id)
    return {
        **service.registry.get(key_id).to_dict(),
        "calibration": calibration.to_dict() if calibration is not None else None,
    }


@router.post("/{key_id}/rotate", response_model=KeyPublic, summary="Rotate a key")
def rotate_key(key_id: KeyIdPath, token: AdminToken, service: ServiceDep) -> dict[str, Any]:
    """Create a successor (returned); the old key is retired and still detected."""
    return service.registry.rotate(key_id, actor=token.actor).to_dict()


@router.post("/{key_id}/revoke", response_model=KeyPublic, summary="Revoke a key")
def revoke_key(key_id: KeyIdPath, token: AdminToken, service: ServiceDep) -> dict[str, Any]:
    """Revoke a key: it neither generates nor detects any more (idempotent)."""
    return service.registry.revoke(key_id, actor=token.actor).to_dict()
