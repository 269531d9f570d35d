"""`WatermarkSpec`: the contract between generator and detector, stored next to every key.

Detection always uses exactly the spec that generation used. Anything that changes how a
pivot is computed bumps `spec_version`; every version this release knows keeps working
(tests/vectors pins them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from wmark.errors import SpecError

__all__ = [
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "PrfRef",
    "TokenizerRef",
    "WatermarkSpec",
]

SPEC_VERSION = 1
SUPPORTED_SPEC_VERSIONS = frozenset({1})
PRF_NAME = "hmac-sha256/philox4x32-10"
PRF_VERSION = 1
MAX_CONTEXT_WIDTH = 16

ContextMode = Literal["window", "prefix"]
Dedup = Literal["v1", "none"]


@dataclass(frozen=True, kw_only=True)
class PrfRef:
    """Which keyed pseudo-random function derives the clocks (name + version)."""

    name: str = PRF_NAME
    version: int = PRF_VERSION


@dataclass(frozen=True, kw_only=True)
class TokenizerRef:
    """The tokenizer a key is bound to: detection refuses any other.

    Attributes:
        name: human label (e.g. "qwen2.5-coder").
        sha256: SHA-256 hex of the canonical tokenizer.json bytes.
        vocab_size: number of token IDs (IDs must be < vocab_size).
    """

    name: str
    sha256: str
    vocab_size: int


@dataclass(frozen=True, kw_only=True)
class WatermarkSpec:
    """Everything detection needs to replay generation's keyed clocks.

    Attributes:
        tokenizer: the tokenizer the key is bound to.
        context_width: h, the number of preceding token IDs hashed into a position's label.
        context_mode: "window" (label = the h previous IDs; no prompt needed to detect) or
            "prefix" (label = every previous ID; only to replicate the paper, needs the prompt).
        dedup: "v1" scores only the first occurrence of each window (Three Bricks v1), the
            only setting for which window-mode p-values are exact on repetitive text.
        min_scored_tokens: below this many scored tokens the verdict is
            "insufficient_evidence" whatever the p-value.
        prf: the keyed PRF.
        spec_version: the version of this record's semantics.
    """

    tokenizer: TokenizerRef
    context_width: int = 4
    context_mode: ContextMode = "window"
    dedup: Dedup = "v1"
    min_scored_tokens: int = 16
    prf: PrfRef = field(default_factory=PrfRef)
    spec_version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        if self.spec_version not in SUPPORTED_SPEC_VERSIONS:
            raise SpecError(
                f"spec_version {self.spec_version} is not supported by this release "
                f"(supported: {sorted(SUPPORTED_SPEC_VERSIONS)}); upgrade wmark"
            )
        if (self.prf.name, self.prf.version) != (PRF_NAME, PRF_VERSION):
            raise SpecError(f"unknown PRF {self.prf.name!r} v{self.prf.version}")
        if not 1 <= self.context_width <= MAX_CONTEXT_WIDTH:
            raise SpecError(f"context_width must be in 1..{MAX_CONTEXT_WIDTH}, got {self.context_width}")
        if self.context_mode not in ("window", "prefix"):
            raise SpecError(f"context_mode must be 'window' or 'prefix', got {self.context_mode!r}")
        if self.dedup not in ("v1", "none"):
            raise SpecError(f"dedup must be 'v1' or 'none', got {self.dedup!r}")
        if self.context_mode == "window" and self.dedup != "v1":
            raise SpecError("window mode needs dedup 'v1': without it repeated text breaks p-values")
        if self.min_scored_tokens < 1:
            raise SpecError("min_scored_tokens must be at least 1")
        if self.tokenizer.vocab_size < 2:
            raise SpecError("tokenizer vocab_size must be at least 2")
        if len(self.tokenizer.sha256) != 64:
            raise SpecError("tokenizer sha256 must be 64 hex characters")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what `to_json` serialises)."""
        return asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace, so equal specs give equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatermarkSpec:
        """Inverse of `to_dict`; unknown fields are an error, not silently dropped."""
        try:
            fields = dict(data)
            tokenizer = TokenizerRef(**fields.pop("tokenizer"))
            prf = PrfRef(**fields.pop("prf", {}))
            return cls(tokenizer=tokenizer, prf=prf, **fields)
        except SpecError:
            raise
        except (TypeError, KeyError, AttributeError) as exc:
            raise SpecError(f"malformed watermark spec: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> WatermarkSpec:
        """Parse `to_json` output."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"watermark spec is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SpecError("watermark spec must be a JSON object")
        return cls.from_dict(data)
