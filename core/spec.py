"""`WatermarkSpec`: the contract between generator and detector, stored next to every key.

Detection always uses exactly the spec that generation used. Anything that changes how a
pivot is computed bumps `spec_version`; every version this release knows keeps working
(tests/vectors pins them). A spec's `scheme` says whose watermark it is: wmark's own keyed race
("wmark"), or vLLM's native keyed Gumbel-max ("vllm-gumbel", "vllm-dual-key-gumbel"), which
wmark detects but does not generate (`wmark.vllm_gumbel`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from wmark.errors import SpecError

__all__ = [
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "VLLM_SCHEMES",
    "PrfRef",
    "Scheme",
    "TokenizerRef",
    "WatermarkSpec",
]

SPEC_VERSION = 1
SUPPORTED_SPEC_VERSIONS = frozenset({1})
PRF_NAME = "hmac-sha256/philox4x32-10"
PRF_VERSION = 1
MAX_CONTEXT_WIDTH = 16
VLLM_PRF_NAME = "vllm-philox4x32-10"  # vLLM's PhiloxPRF.version "philox4x32-10-v1"
VLLM_PRF_VERSION = 1
MAX_VLLM_CONTEXT_WIDTH = 256  # vLLM sets no bound (it warns above 16); this keeps rows small

ContextMode = Literal["window", "prefix"]
Dedup = Literal["v1", "none"]
Scheme = Literal["wmark", "vllm-gumbel", "vllm-dual-key-gumbel"]
VLLM_SCHEMES: tuple[Scheme, ...] = ("vllm-gumbel", "vllm-dual-key-gumbel")


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
        scheme: "wmark" (the keyed race), or a vLLM scheme: "vllm-gumbel" or
            "vllm-dual-key-gumbel" (vLLM's Philox PRF, contexts padded with -1 at the start of
            the generated text, dedup v1 over those contexts).
        dual_key_alpha: vLLM's `alpha` (weight of key B) for "vllm-dual-key-gumbel", else None.
    """

    tokenizer: TokenizerRef
    context_width: int = 4
    context_mode: ContextMode = "window"
    dedup: Dedup = "v1"
    min_scored_tokens: int = 16
    prf: PrfRef = field(default_factory=PrfRef)
    spec_version: int = SPEC_VERSION
    scheme: Scheme = "wmark"
    dual_key_alpha: float | None = None

    def __post_init__(self) -> None:
        if self.spec_version not in SUPPORTED_SPEC_VERSIONS:
            raise SpecError(
                f"spec_version {self.spec_version} is not supported by this release "
                f"(supported: {sorted(SUPPORTED_SPEC_VERSIONS)}); upgrade wmark"
            )
        if self.scheme == "wmark":
            prf, max_width = (PRF_NAME, PRF_VERSION), MAX_CONTEXT_WIDTH
        elif self.scheme in VLLM_SCHEMES:
            prf, max_width = (VLLM_PRF_NAME, VLLM_PRF_VERSION), MAX_VLLM_CONTEXT_WIDTH
            self._check_vllm()
        else:
            raise SpecError(f"unknown scheme {self.scheme!r}; known: wmark, {', '.join(VLLM_SCHEMES)}")
        if (self.prf.name, self.prf.version) != prf:
            raise SpecError(f"unknown PRF {self.prf.name!r} v{self.prf.version} for scheme {self.scheme}")
        if not 1 <= self.context_width <= max_width:
            raise SpecError(f"context_width must be in 1..{max_width}, got {self.context_width}")
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

    def _check_vllm(self) -> None:
        if self.context_mode != "window":
            raise SpecError("vLLM schemes label positions by a window of previous tokens")
        if self.scheme == "vllm-dual-key-gumbel":
            alpha = self.dual_key_alpha
            if not (isinstance(alpha, float | int) and 0.0 <= alpha <= 1.0):
                raise SpecError(f"dual_key_alpha must be in [0, 1], got {alpha!r}")
        elif self.dual_key_alpha is not None:
            raise SpecError("dual_key_alpha is only for the vllm-dual-key-gumbel scheme")

    @property
    def is_vllm(self) -> bool:
        """Whether this is one of vLLM's native schemes (detected here, generated by vLLM)."""
        return self.scheme in VLLM_SCHEMES

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what `to_json` serialises).

        A wmark-scheme spec leaves out the scheme fields, so specs stored before vLLM schemes
        existed keep their exact bytes.
        """
        data = asdict(self)
        if self.scheme == "wmark":
            del data["scheme"], data["dual_key_alpha"]
        return data

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
