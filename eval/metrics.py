"""The evaluation's figures, as pure functions of stored per-text data (docs/algorithms.md §7-8).

- AATPS: emitted tokens / target verification forwards, per text (the prompt prefill is not a
  verification forward); tables give mean ± std over texts. Hu & Huang pool instead (mean block
  length over all blocks of all texts): `pooled_aatps`.
- ANLPPT under a score (U, Aaronson, Li, PL): -ln p / n_scored per text (the S1 convention), mean
  ± std over texts. Hu & Huang's pooled variant, sum of -ln p over texts / sum of generated
  tokens, is `pooled_anlppt`.
- Detection at T tokens: the text cut to its first T generated tokens, the exact Aaronson
  Gamma-tail test on the scored positions among them; detected iff ln p <= ln alpha.
- LPPL: mean of -ln P_proc(y_t | prefix) over emitted tokens under the processed target
  distribution (non-finite terms dropped and counted).
- ROUGE-L: LCS-based F1 between token-ID sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from wmark.scoring import SCORES, ScoreName, score_pivots

__all__ = [
    "Interval",
    "binomial_interval",
    "detected_at",
    "log_p_at",
    "lppl",
    "mean_std",
    "pooled_aatps",
    "pooled_anlppt",
    "rouge_l",
    "scores",
    "standard_error",
]


def scores(pivots: npt.NDArray[np.float64]) -> dict[ScoreName, float]:
    """ln p of the pivots under each score (exact Gamma for Aaronson, Chernoff bounds otherwise)."""
    return {name: score_pivots(pivots, name).log_p for name in SCORES}


def log_p_at(positions: npt.ArrayLike, pivots: npt.ArrayLike, tokens: int) -> tuple[float, int]:
    """Aaronson ln p and n_scored over the scored positions among the first `tokens` generated ones.

    Args:
        positions: generated indices (0 = first generated token) of the scored positions, ascending.
        pivots: their pivots.
        tokens: T, the number of generated tokens the detector sees.
    """
    pos = np.asarray(positions, dtype=np.int64)
    test = score_pivots(np.asarray(pivots, dtype=np.float64)[pos < tokens])
    return test.log_p, test.n


def detected_at(positions: npt.ArrayLike, pivots: npt.ArrayLike, tokens: int, alpha: float) -> bool:
    """Whether the first `tokens` generated tokens are flagged at level alpha (exact Gamma test)."""
    return log_p_at(positions, pivots, tokens)[0] <= math.log(alpha)


def lppl(token_probs: Sequence[float]) -> tuple[float, int]:
    """(mean -ln p over the finite terms, number of dropped terms) of the emitted tokens' probabilities."""
    p = np.asarray(token_probs, dtype=np.float64)
    keep = p > 0
    if not keep.any():
        return math.nan, len(p)
    return float(-np.log(p[keep]).mean()), int((~keep).sum())


def rouge_l(candidate: Sequence[int], reference: Sequence[int]) -> float:
    """ROUGE-L F1: 2 * LCS / (len(candidate) + len(reference)) (0 when either is empty)."""
    if not candidate or not reference:
        return 0.0
    # LCS by the row-wise DP; prev[j] = LCS of the candidate prefix and reference[:j].
    prev = [0] * (len(reference) + 1)
    for token in candidate:
        cur = [0]
        for j, ref_token in enumerate(reference):
            cur.append(prev[j] + 1 if token == ref_token else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    return 2.0 * lcs / (len(candidate) + len(reference))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN for none)."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if len(x) == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else 0.0


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean (NaN with fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    return float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def pooled_aatps(blocks: Sequence[Sequence[int]]) -> float:
    """Hu & Huang's AATPS: mean block length over all blocks of all texts."""
    lengths = [b for text in blocks for b in text]
    return sum(lengths) / len(lengths) if lengths else math.nan


def pooled_anlppt(log_ps: Sequence[float], n_tokens: Sequence[int]) -> float:
    """Hu & Huang's ANLPPT: sum of -ln p over texts / sum of generated tokens (skipped ones included)."""
    total = sum(n_tokens)
    return -sum(log_ps) / total if total else math.nan


@dataclass(frozen=True)
class Interval:
    """An observed rate k/n with its two-sided Clopper-Pearson confidence interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        """k / n (NaN when n = 0)."""
        return self.k / self.n if self.n else math.nan

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the interval (the rate is consistent with it)."""
        return self.low <= value <= self.high


def binomial_interval(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Clopper-Pearson interval for a binomial rate (exact, conservative)."""
    if n == 0:
        return Interval(0, 0, 0.0, 1.0)
    tail = (1.0 - confidence) / 2.0
    low = float(stats.beta.ppf(tail, k, n - k + 1)) if k > 0 else 0.0
    high = float(stats.beta.ppf(1.0 - tail, k + 1, n - k)) if k < n else 1.0
    return Interval(k, n, low, high)
