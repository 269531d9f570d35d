"""The result of a detection: one shape for the Python API, `wmark detect --json` and REST."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Detection", "KeyResult", "TokenEvidence", "Verdict"]

Verdict = Literal["watermarked", "not_detected", "insufficient_evidence"]


@dataclass(frozen=True, kw_only=True)
class KeyResult:
    """The test against one key.

    Attributes:
        key_id: the key.
        n_scored: positions scored under this key's spec.
        score: Aaronson score (sum of -ln(1 - pivot)).
        log_p: exact log p-value for this key alone.
        adjusted_log_p: log of the Holm-adjusted p-value over all keys tested.
    """

    key_id: str
    n_scored: int
    score: float
    log_p: float
    adjusted_log_p: float

    @property
    def adjusted_p(self) -> float:
        """Holm-adjusted p-value (0.0 only when it underflows)."""
        return math.exp(self.adjusted_log_p)


@dataclass(frozen=True, kw_only=True)
class TokenEvidence:
    """One token of the text and its evidence, for highlighting.

    Attributes:
        token_id: the token.
        start, end: its character span in the text (None for token-ID input).
        pivot: U(y_t, 1) under the reported key, None where the position is not scored.
        score: -ln(1 - pivot), the token's contribution (mean 1 under H0).
    """

    token_id: int
    start: int | None
    end: int | None
    pivot: float | None
    score: float | None


@dataclass(frozen=True, kw_only=True)
class Detection:
    """Verdict on one text.

    Attributes:
        verdict: "watermarked" if the Holm-adjusted p-value of some key is <= alpha with enough
            scored tokens; "insufficient_evidence" if no key had min_scored_tokens; else
            "not_detected".
        p_value: Holm-adjusted p-value of the reported key (0.0 only on float underflow).
        log_p: its natural log, exact far below 1e-300.
        score: the reported key's Aaronson score.
        n_scored: scored positions under the reported key.
        n_tokens: tokens in the text.
        key_id: the matched key when watermarked, else the key with the smallest p-value.
        spec_version: the spec version of the reported key.
        alpha: the significance level used.
        keys: the test against every key tried.
        tokens: per-token evidence under the reported key, when asked for.
        source: where the text came from (file name, document id), when known.
        reading: which reading of the text the reported key's test is on (0: the first of
            `wmark.detector.readings`; always 0 for token IDs), among `n_readings` tried (the
            Bonferroni factor in `log_p`).
    """

    verdict: Verdict
    p_value: float
    log_p: float
    score: float
    n_scored: int
    n_tokens: int
    key_id: str
    spec_version: int
    alpha: float
    keys: tuple[KeyResult, ...]
    tokens: tuple[TokenEvidence, ...] | None = None
    source: str | None = None
    reading: int = 0
    n_readings: int = 1

    def to_dict(self, *, include_tokens: bool = True) -> dict[str, Any]:
        """JSON-ready dict; `keys` carries the per-key results, `tokens` only if computed."""
        data = asdict(self)
        data["keys"] = [{**asdict(k), "adjusted_p": k.adjusted_p} for k in self.keys]
        if not include_tokens or self.tokens is None:
            data.pop("tokens")
        return data
