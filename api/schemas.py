"""Request and response shapes of the REST API (pydantic). `KeyPublic` has no secret field, ever.

Detection responses carry the same fields as `wmark detect --json` (`Detection.to_dict()`), plus
`audit_seq`, the audit log row that records the answer; their models are built from the fields of
`wmark.detector.result`'s dataclasses (`_mirror`), so the two shapes cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import MISSING
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from wmark.detector.result import Detection, KeyResult, TokenEvidence
from wmark.spec import MAX_VLLM_CONTEXT_WIDTH
from wmark.vllm_gumbel import VllmWatermarkConfig

__all__ = [
    "AuditEventOut",
    "AuditPage",
    "BatchRequest",
    "BatchResponse",
    "CalibrationOut",
    "DetectItem",
    "DetectRequest",
    "DetectResponse",
    "ErrorOut",
    "KeyCreate",
    "KeyDetail",
    "KeyList",
    "KeyPublic",
    "ReceiptKeySet",
    "VerifyOut",
    "VllmConfigIn",
    "VllmKeyCreate",
]


def _integral(value: object) -> object:
    """4.0 is an integer to JSON Schema (and so to generated clients); true and "4" are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_Integral = BeforeValidator(_integral)  # after the bounds, so that they stay in the JSON schema
KeyId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
TokenId = Annotated[int, Field(ge=0, le=2**32 - 1), _Integral]
Alpha = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
KeyIds = Annotated[list[KeyId], Field(max_length=64, fail_fast=True)]
# fail_fast on the request's lists: validation stops at a list's first bad element. Without it a
# 1 MiB body of bad elements made one error each (~350,000: seconds and ~1 GB to build and drop).


# Python's str.strip() (what the detector calls blank) removes \x1c-\x1f too; regex \s does not.
_NOT_BLANK = r"[^\s\x1c-\x1f]"


class _Strict(BaseModel):
    """Request bodies: unknown fields and type coercion ("1" for 1, true for 1, "yes" for true) are 422."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorOut(BaseModel):
    """The one error shape of the service."""

    code: str = Field(description="Stable, machine-readable error code.")
    message: str = Field(description="What went wrong, for people (never echoes the input).")


class DetectItem(_Strict):
    """One input: exactly one of `text` and `token_ids`, and `prompt_ids` only with `token_ids`
    (the schema's oneOf says so to clients)."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["text"],
                    "not": {"anyOf": [{"required": ["token_ids"]}, {"required": ["prompt_ids"]}]},
                },
                {"required": ["token_ids"], "not": {"required": ["text"]}},
            ]
        }
    )

    # `| SkipJsonSchema[None]`: absent is allowed, an explicit null is not (see _no_null)
    text: Annotated[str, StringConstraints(pattern=_NOT_BLANK)] | SkipJsonSchema[None] = Field(
        None, description="The text to test (UTF-8, not blank)."
    )
    token_ids: Annotated[list[TokenId], Field(min_length=1, fail_fast=True)] | SkipJsonSchema[None] = Field(
        None, description="Token IDs instead of text."
    )
    prompt_ids: Annotated[list[TokenId], Field(min_length=1, fail_fast=True)] | SkipJsonSchema[None] = Field(
        None,
        description="With `token_ids`: the prompt's token IDs as the model saw them, chat template "
        "included (`prompt_ids` of `wmark generate --json`), in front of the answer's `token_ids`. "
        "Keys in prefix context mode need it (each position's label is everything before it, "
        "prompt included); window keys also score the answer's first tokens, whose windows reach "
        "into the prompt; vLLM-scheme keys ignore it (vLLM's contexts start at the answer).",
    )
    source: Annotated[str, StringConstraints(max_length=200)] | SkipJsonSchema[None] = Field(
        None, description="A label echoed back (document id, file name)."
    )

    @field_validator("text", "token_ids", "prompt_ids", "source", mode="before")
    @classmethod
    def _no_null(cls, value: object) -> object:
        if value is None:  # the schema does not allow null: leave the field out instead
            raise ValueError("must not be null (leave the field out)")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> DetectItem:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("give exactly one of text and token_ids")
        if self.prompt_ids is not None and self.token_ids is None:
            raise ValueError(
                "prompt_ids go with token_ids: a text's token IDs depend on each key's tokenizer"
            )
        if self.text is not None:
            try:
                self.text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("text is not valid Unicode (lone surrogate)") from None
        return self


class DetectRequest(DetectItem):
    """POST /v1/detect."""

    key_ids: KeyIds | None = Field(None, description="Keys to test; default every active and retired key.")
    alpha: Alpha = Field(0.01, description="Significance level, family-wise over the keys tested.")
    return_tokens: bool = Field(False, description="Include per-token evidence (pivots) for highlighting.")
    receipt: bool = Field(
        False,
        description="Include a signed receipt of the verdict (`receipt`: canonical JSON, Ed25519; "
        "verify it offline against GET /v1/receipts/keys).",
    )


class BatchRequest(_Strict):
    """POST /v1/detect/batch: one audit row per item."""

    items: Annotated[list[DetectItem], Field(min_length=1, fail_fast=True)]
    key_ids: KeyIds | None = None
    alpha: Alpha = 0.01
    return_tokens: bool = False
    receipt: bool = Field(False, description="A signed receipt with each result.")


def _mirror(
    name: str, source: type[Any], doc: str, *, types: Mapping[str, Any] | None = None, **extra: Any
) -> type[BaseModel]:
    """The response model of a result dataclass: its fields, in its order and with its defaults.

    Args:
        name, doc: the model's name and description (the OpenAPI schema's title and description).
        source: the dataclass (`Detection.to_dict()` and the like are what the service answers).
        types: a field's type in the schema where it differs (a nested model, named by a string).
        extra: fields after the dataclass's, as `create_model` takes them.
    """
    hints = {**get_type_hints(source), **(types or {})}
    fields: dict[str, Any] = {
        f.name: (hints[f.name], ... if f.default is MISSING else f.default)
        for f in dataclasses.fields(source)
    }
    return _model(name, doc, **fields, **extra)


def _model(name: str, doc: str, **fields: Any) -> type[BaseModel]:
    """A response model built from field definitions (a string names a model defined above)."""
    return create_model(name, __doc__=doc, __module__=__name__, **fields)


KeyResultOut = _mirror("KeyResultOut", KeyResult, "The test against one key.", adjusted_p=(float, ...))
TokenOut = _mirror(
    "TokenOut",
    TokenEvidence,
    "One token and its evidence: `pivot` is U(y_t, 1), `score` = -ln(1 - pivot); null where unscored.",
)
SkippedKeyOut = _model(
    "SkippedKeyOut",
    "A key left out of the detection, and why (`key_unavailable`: sealed under another master key).",
    key_id=(str, ...),
    code=(str, ...),
    message=(str, ...),
)
CalibrationWarningOut = _model(
    "CalibrationWarningOut",
    "A key tested whose false-positive rate was never measured on the user's text (`uncalibrated`), "
    "or was measured under another spec (`stale`): `wmark calibrate` measures it.",
    key_id=(str, ...),
    state=(Literal["uncalibrated", "stale"], ...),
)
DetectResponse = _mirror(
    "DetectResponse",
    Detection,
    "A verdict (the fields of `wmark detect --json`) and the audit row that records it.",
    types={"keys": "list[KeyResultOut]", "tokens": "list[TokenOut] | None"},
    audit_seq=(int, ...),
    receipt=(
        str | None,
        Field(None, description="The signed receipt, when asked for: keep these exact bytes to verify it."),
    ),
    calibration_warnings=(
        "list[CalibrationWarningOut] | None",
        Field(
            None,
            description="Keys tested that were never calibrated on the user's text, or under another "
            "spec (absent if none): their false-positive rate there is unmeasured.",
        ),
    ),
    skipped_keys=(
        "list[SkippedKeyOut] | None",
        Field(None, description="Keys left out because the master key cannot open them (absent if none)."),
    ),
)
BatchResponse = _model(
    "BatchResponse", "Results in the order of the items.", results=("list[DetectResponse]", ...)
)


class KeyCreate(_Strict):
    """POST /v1/keys: a new key bound to a tokenizer already in the registry."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
    tokenizer_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="SHA-256 of a tokenizer.json stored in the registry (see an existing key's spec)."
    )
    context_width: Annotated[int, Field(ge=1, le=16), _Integral] = 4
    context_mode: Literal["window", "prefix"] = Field(
        "window",
        description="'window' (label: the previous context_width tokens), or 'prefix' (the paper's "
        "labels: every previous token, prompt included; detect with `prompt_ids`).",
    )
    min_scored_tokens: Annotated[int, Field(ge=1, le=100_000), _Integral] = 16


def _vllm_default(name: str) -> Any:
    """The default of a vLLM config field, as `VllmWatermarkConfig` (vLLM's own) has it."""
    return VllmWatermarkConfig.__dataclass_fields__[name].default


def _at_most(bound: int) -> str:
    """A regular expression of the decimal numerals 0..`bound`, without leading zeros."""
    digits = str(bound)
    shorter = f"[1-9][0-9]{{0,{len(digits) - 2}}}" if len(digits) > 1 else ""
    same = []  # numerals of len(digits) digits: a prefix of the bound, one digit less, then any
    for i, d in enumerate(digits):
        low = "1" if i == 0 else "0"
        if int(d) > int(low):
            rest = len(digits) - i - 1
            below = low if int(d) - 1 == int(low) else f"[{low}-{int(d) - 1}]"
            same.append(f"{digits[:i]}{below}" + (f"[0-9]{{{rest}}}" if rest else ""))
    same.append(digits)
    return "^(0|" + "|".join(filter(None, [shorter, *same])) + ")$"


_JSON_SAFE = 2**53 - 1  # integers above it lose digits in JavaScript, jq and any JSON tool on doubles
_VLLM_KEY_MAX = 2**64 - 1
_VLLM_KEY_DIGITS = _at_most(_VLLM_KEY_MAX)
_VLLM_KEY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": _JSON_SAFE},
        {"type": "string", "pattern": _VLLM_KEY_DIGITS},
    ],
    "writeOnly": True,
}


def _vllm_key(value: object) -> object:
    """A vLLM key: a JSON integer up to 2^53 - 1 (4.0 counts), or a string of decimal digits up to
    2^64 - 1. Larger JSON numbers are refused, not taken: a tool on doubles may have rounded them
    to another key."""
    value = _integral(value)
    if isinstance(value, str):
        if re.fullmatch(_VLLM_KEY_DIGITS, value) is None:
            raise ValueError("a key given as a string must be its decimal digits, 0..2^64 - 1")
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= _JSON_SAFE:
        raise ValueError(
            "a key given as a JSON number must be in 0..2^53 - 1; give a larger one as a string "
            'of its decimal digits ("key": "18446744073709551615")'
        )
    return value


class VllmConfigIn(_Strict):
    """vLLM's `--watermark-config` (its `WatermarkConfig`), as the deployment runs with it.

    Only `key`, `algorithm`, `alpha` and `context_width` change detection; the other fields are
    checked as vLLM checks them, so a config vLLM refuses is refused here too.
    """

    key: Annotated[int, BeforeValidator(_vllm_key), WithJsonSchema(_VLLM_KEY_SCHEMA)] = Field(
        description="The secret watermark key, 0..2^64 - 1: a JSON integer up to 2^53 - 1, or its "
        "decimal digits as a string (any key; JSON tools round larger numbers). Write-only, sealed "
        "under the master key, never returned.",
    )
    algorithm: Literal["gumbel", "dual_key_gumbel"] = _vllm_default("algorithm")
    alpha: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = Field(
        _vllm_default("alpha"), description="dual_key_gumbel: the weight of key B."
    )
    context_width: Annotated[int, Field(ge=1, le=MAX_VLLM_CONTEXT_WIDTH), _Integral] = _vllm_default(
        "context_width"
    )
    deduplicate_contexts: Literal["none", "single_turn", "all"] = _vllm_default("deduplicate_contexts")
    deduplicate_contexts_max_history: Annotated[int, Field(ge=1, le=2**31 - 1), _Integral] | None = (
        _vllm_default("deduplicate_contexts_max_history")
    )
    prf: Literal["philox"] = _vllm_default("prf")
    allow_target_only_watermarking: bool = _vllm_default("allow_target_only_watermarking")

    def __repr__(self) -> str:
        return f"VllmConfigIn(algorithm={self.algorithm!r}, key=<redacted>)"

    __str__ = __repr__


class VllmKeyCreate(_Strict):
    """POST /v1/vllm-keys: register a vLLM deployment's key, to detect its native watermark."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
    tokenizer_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="SHA-256 of the deployment's tokenizer.json, stored in the registry."
    )
    watermark_config: VllmConfigIn
    min_scored_tokens: Annotated[int, Field(ge=1, le=100_000), _Integral] = 16


class KeyPublic(BaseModel):
    """A key's public view: never its secret."""

    key_id: str
    name: str
    status: Literal["active", "retired", "revoked"]
    fingerprint: str
    spec: dict[str, Any]
    created_at: str
    rotated_at: str | None
    revoked_at: str | None
    replaces: str | None
    replaced_by: str | None


class VllmKeyCreated(KeyPublic):
    """POST /v1/vllm-keys's answer: the key's public view, and what the service noticed."""

    warnings: list[str] | None = Field(
        None, description="Present when the key is guessable (below 2^48): serve with a random 64-bit key."
    )


class CalibrationOut(BaseModel):
    """A key's newest calibration (`wmark calibrate`): its false-positive rate on the user's text."""

    calibration_id: str
    created_at: str
    corpus_sha256: str = Field(description="SHA-256 of the sorted SHA-256s of the corpus's texts.")
    spec_sha256: str = Field(description="SHA-256 of the key's spec when it was calibrated.")
    stale: bool = Field(description="The key's spec changed since: the calibration measured other p-values.")
    alpha: float
    n_scored: int = Field(description="Documents scored into the rate.")
    n_flagged: int = Field(description="Of those, documents at p <= alpha.")
    report: dict[str, Any] = Field(description="The whole report, as `wmark calibrate --json` prints it.")


class KeyDetail(KeyPublic):
    """GET /v1/keys/{key_id}: a key's public view and its newest calibration (null: never calibrated)."""

    calibration: CalibrationOut | None


class KeyList(BaseModel):
    """GET /v1/keys."""

    keys: list[KeyPublic]


class AuditEventOut(BaseModel):
    """One audit row."""

    seq: int
    at: str
    actor: str
    action: str
    key_ids: list[str]
    text_sha256: str | None
    result: dict[str, Any]
    prev_hash: str
    row_hash: str


class AuditPage(BaseModel):
    """GET /v1/audit: newest first; pass `next_before` as `before` for the next page."""

    events: list[AuditEventOut]
    next_before: int | None


class VerifyOut(BaseModel):
    """GET /v1/audit/verify."""

    ok: bool
    rows: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None
    reason: str | None


class ReceiptKeyOut(BaseModel):
    """A receipt signing key as a JWK (RFC 8037), with its status; `kid` is its RFC 7638 thumbprint."""

    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    x: str = Field(description="The public key: 32 bytes, base64url without padding.")
    kid: str
    alg: Literal["EdDSA"]
    use: Literal["sig"]
    status: Literal["active", "retired", "revoked"] = Field(
        description="active: signs now; retired: rotated out, its receipts still verify; "
        "revoked: they do not.",
    )
    created_at: str
    retired_at: str | None = None
    revoked_at: str | None = None


class ReceiptKeySet(BaseModel):
    """GET /v1/receipts/keys: a JWKS document of every signing key, revoked ones included."""

    keys: list[ReceiptKeyOut]
