"""POST /v1/detect and /v1/detect/batch: verdicts with exact p-values, each one audited.

Detection is CPU-bound, so it runs in the service's thread pool (`Service.in_thread`: one plain
executor hop, cheaper than FastAPI's anyio hop for `def` endpoints) and the event loop stays
free. The detector comes from the per-process cache; the token's revocation and the key set are
re-checked in the audit transaction, where the request writes its row anyway (one query each per
group commit, not per request).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy.orm import Session

from wmark.api.admission import reject
from wmark.api.deps import AdmittedRoute, DetectorToken, Service, ServiceDep, decoded_body
from wmark.api.detectors import KeysChanged, KeySet
from wmark.api.errors import AUTHENTICATED, TextTooLong, documented
from wmark.api.schemas import BatchRequest, BatchResponse, DetectItem, DetectRequest, DetectResponse
from wmark.api.settings import Settings
from wmark.detector import Detection, Detector
from wmark.detector.receipt import detection_claims
from wmark.keys.audit import AuditEntry, detection_entry, text_digest
from wmark.keys.tokens import TokenInfo, TokenRejected, TokenStore
from wmark.receipts import token_ids_sha256

__all__ = [
    "bounded_detect",
    "check_sizes",
    "detect",
    "detect_all",
    "detect_one",
    "input_digest",
    "input_kind",
    "json_response",
    "router",
]

router = APIRouter(route_class=AdmittedRoute, tags=["detect"], responses=documented(*AUTHENTICATED, 404, 409))


def input_digest(item: DetectItem) -> str:
    """SHA-256 of the text, or of the token IDs as comma-separated decimals (with a prompt: its
    IDs likewise, then "|", then the answer's); receipts hash the input alike."""
    if item.text is not None:
        return text_digest(item.text)
    return token_ids_sha256(item.token_ids or [], item.prompt_ids)


def input_kind(item: DetectItem) -> str:
    """What the audit row and the receipt say was tested."""
    if item.text is not None:
        return "text"
    return "prompt_and_token_ids" if item.prompt_ids else "token_ids"


def check_sizes(settings: Settings, items: Sequence[object]) -> None:
    """Bound the work of one request before doing any: items, each item, and all of them together.

    `items` as JSON decoded them, before validation, so that an oversized request costs neither
    pydantic's validation of every item nor its errors (a 1 MiB body holds ~350,000 empty items:
    seconds of the event loop and ~1 GB to validate); what is not an object with a text or a
    list counts nothing here, and validation refuses it.
    """
    limit = settings.max_text_chars
    if len(items) > settings.max_batch_items:
        raise TextTooLong(f"a batch may hold at most {settings.max_batch_items} items")
    total = 0
    for i, item in enumerate(items):
        fields = item if isinstance(item, dict) else {}
        text = fields.get("text")
        size = len(text) if isinstance(text, str) else _length(fields.get("token_ids"))
        size += _length(fields.get("prompt_ids"))
        total += size
        if size > limit:
            where = f"item {i}: " if len(items) > 1 else ""
            unit = "characters" if isinstance(text, str) else "token IDs"
            raise TextTooLong(f"{where}the input has {size} {unit}; the limit is {limit}")
    if total > settings.max_request_chars:
        raise TextTooLong(
            f"the items hold {total} characters and token IDs together; the limit per request is "
            f"{settings.max_request_chars}: split the batch"
        )


def _length(value: object) -> int:
    return len(value) if isinstance(value, list) else 0


async def bounded_detect(request: Request, service: ServiceDep) -> None:
    """POST /v1/detect's body within the limits (`check_sizes`): a dependency after admission,
    which FastAPI resolves before it validates the body."""
    check_sizes(service.settings, [await decoded_body(request)])


async def bounded_batch(request: Request, service: ServiceDep) -> None:
    """POST /v1/detect/batch's items within the limits, as `bounded_detect`."""
    body = await decoded_body(request)
    items = body.get("items") if isinstance(body, dict) else None
    check_sizes(service.settings, items if isinstance(items, list) else [])


BoundedDetect = Annotated[None, Depends(bounded_detect)]
BoundedBatch = Annotated[None, Depends(bounded_batch)]


def _check_response(service: Service, detections: Sequence[Detection]) -> None:
    """Bound the response: per-token evidence is ~90 bytes a token."""
    limit = service.settings.max_response_tokens
    tokens = sum(d.n_tokens for d in detections)
    if tokens > limit:
        raise TextTooLong(
            f"the answer would carry evidence for {tokens} tokens; the limit is {limit}: "
            "ask without return_tokens, or split the batch"
        )


def _run(detector: Detector, item: DetectItem, *, alpha: float, return_tokens: bool) -> Detection:
    if item.text is not None:
        return detector.detect(item.text, alpha=alpha, return_tokens=return_tokens, source=item.source)
    prompt = item.prompt_ids or []
    return detector.detect(
        token_ids=[*prompt, *(item.token_ids or [])],
        start=len(prompt),
        alpha=alpha,
        return_tokens=return_tokens,
        source=item.source,
    )


def _entry(actor: str, item: DetectItem, detector: Detector, answer: dict[str, Any]) -> AuditEntry:
    return detection_entry(
        actor=actor,
        key_ids=[k.key_id for k in detector.keys],
        text_sha256=input_digest(item),
        detection=answer,  # the audited fields are picked from it; per-token evidence is not
        input_kind=input_kind(item),
    )


_ATTEMPTS = 3  # detections per request when keys keep changing under it (then 409 keys_changed)


def detect_all(
    service: Service,
    request: Request,
    token: TokenInfo,
    items: Sequence[DetectItem],
    *,
    key_ids: Sequence[str] | None,
    alpha: float,
    return_tokens: bool,
    receipt: bool = False,
) -> list[dict[str, Any]]:
    """Detect `items` (their sizes checked before validation: `check_sizes`), audited, in order."""
    for attempt in range(_ATTEMPTS):
        keys = service.detectors.get(key_ids, refresh=attempt > 0)
        detections = [_run(keys.detector, item, alpha=alpha, return_tokens=return_tokens) for item in items]
        if return_tokens:
            _check_response(service, detections)
        answers = [d.to_dict(include_tokens=return_tokens) for d in detections]  # once: it is not cheap

        def still_valid(session: Session, keys: KeySet = keys) -> None:
            TokenStore.ensure_unrevoked(session, token.token_id)
            keys.unchanged(session)

        entries = [
            _entry(token.actor, item, keys.detector, a) for item, a in zip(items, answers, strict=True)
        ]
        try:
            records = service.registry.audit.append(*entries, precondition=still_valid)
        except TokenRejected as exc:  # revoked after the token was cached: refused, as at the door
            service.token_cache.forget(token.token_id)
            reject(service, request, exc.reason, exc.token_id, exc)
        except KeysChanged:
            if attempt == _ATTEMPTS - 1:
                raise
            continue  # detect again with the keys as they are now
        break
    warnings = service.calibration_states.warnings([k.key_id for k in keys.detector.keys])  # cached
    for detection, answer, record in zip(detections, answers, records, strict=True):
        service.metrics.verdicts.labels(detection.verdict).inc()
        answer["audit_seq"] = record.seq
        if warnings:  # keys whose false-positive rate on the user's text is unmeasured
            answer["calibration_warnings"] = warnings
        if keys.skipped:  # keys the master key cannot open: named, each with its error
            answer["skipped_keys"] = [s.to_dict() for s in keys.skipped]
    if receipt:
        _sign(service, token, items, keys.detector, detections, answers)
    return answers


def _sign(
    service: Service,
    token: TokenInfo,
    items: Sequence[DetectItem],
    detector: Detector,
    detections: Sequence[Detection],
    answers: Sequence[dict[str, Any]],
) -> None:
    """Add each answer's signed receipt (after its audit row, whose seq the receipt names)."""
    signer = service.registry.receipt_keys.signer(service.settings.receipt_issuer, actor=token.actor)
    for item, detection, answer in zip(items, detections, answers, strict=True):
        claims = detection_claims(
            detection, detector.keys, input_kind=input_kind(item), input_sha256=input_digest(item)
        )
        answer["receipt"] = signer.sign(claims, audit_seq=answer["audit_seq"])


async def detect_one(
    service: Service, request: Request, token: TokenInfo, body: DetectRequest
) -> dict[str, Any]:
    """One request's detection, audited, in the service's threads (the route and its fast door)."""
    answers = await service.in_thread(
        partial(
            detect_all,
            service,
            request,
            token,
            [body],
            key_ids=body.key_ids,
            alpha=body.alpha,
            return_tokens=body.return_tokens,
            receipt=body.receipt,
        )
    )
    return answers[0]


def json_response(value: Any) -> Response:
    """The answer as JSON, serialised once by orjson: the route's `response_model` documents the
    shape, which `Detection.to_dict()` already has, so FastAPI's validate-and-dump pass (~0.15 ms
    a request) is skipped. Non-finite floats become null, as pydantic writes them."""
    return Response(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


@router.post(
    "/v1/detect",
    response_model=DetectResponse,
    response_model_exclude_unset=True,  # `tokens` only when asked for, as in `wmark detect --json`
    summary="Detect one text or token-ID list",
)
async def detect(
    body: DetectRequest, token: DetectorToken, _sized: BoundedDetect, service: ServiceDep, request: Request
) -> Response:
    """Test a text (or token IDs) against every active and retired key, or the `key_ids` given.

    The verdict is "watermarked" when the Holm-adjusted p-value of some key is at most `alpha`.
    The text itself is never stored: the audit log keeps its SHA-256.
    """
    return json_response(await detect_one(service, request, token, body))


@router.post(
    "/v1/detect/batch",
    response_model=BatchResponse,
    response_model_exclude_unset=True,
    summary="Detect many inputs",
)
async def detect_batch(
    body: BatchRequest, token: DetectorToken, _sized: BoundedBatch, service: ServiceDep, request: Request
) -> Response:
    """Detect every item with the same keys and alpha; one audit row per item, in order."""
    results = await service.in_thread(
        partial(
            detect_all,
            service,
            request,
            token,
            body.items,
            key_ids=body.key_ids,
            alpha=body.alpha,
            return_tokens=body.return_tokens,
            receipt=body.receipt,
        )
    )
    return json_response({"results": results})
