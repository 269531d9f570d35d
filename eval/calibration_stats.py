"""The statistics of a calibration: a false-positive rate with its exact interval, per length
bucket, and whether the p-values are as uniform as a valid test's must be.

- Rates: the Clopper-Pearson interval (exact binomial, `scipy.stats.binomtest`), and the interval
  that Binomial(n, alpha) puts the count of false positives in (`scipy.stats.binom.interval`). A
  key is *within* alpha when the count is at most that interval's upper end: a count below its
  lower end only says the test is conservative on this text, which is allowed.
- Uniformity: a one-sided Kolmogorov-Smirnov test of the p-values against Unif(0, 1) with
  alternative "greater" (the p-values' CDF above the uniform's somewhere: p-values too small).
  A valid p-value is super-uniform, P(p <= x) <= x, and wmark's are by construction where they
  are not exactly uniform: a text read two ways has its smaller p-value doubled and capped at 1
  (Bonferroni over the readings), and vLLM's pivots take 2^24 values. A two-sided test rejects
  such valid, conservative p-values on a corpus large enough (an atom at 1 is enough); the
  one-sided test only rejects p-values that are too small, the failure that matters. Mid-p or
  randomised p-values would make them exactly uniform instead, but they are not the p-values that
  detection reports, and calibration measures those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["LengthBucket", "Rate", "Uniformity", "bucket_edges", "buckets", "rate", "uniformity"]

_BUCKET_EDGES = (32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, kw_only=True)
class Rate:
    """k flagged of n scored, and what alpha allows.

    Attributes:
        flagged, scored: k and n.
        rate: k / n (NaN when n = 0).
        ci_low, ci_high: the Clopper-Pearson interval of the rate at `confidence`.
        expected_low, expected_high: the interval of the count under Binomial(n, alpha).
        within: k <= expected_high (a conservative test may fall below expected_low).
    """

    flagged: int
    scored: int
    rate: float
    ci_low: float
    ci_high: float
    expected_low: int
    expected_high: int
    within: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as None)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def rate(flagged: int, scored: int, *, alpha: float, confidence: float) -> Rate:
    """The rate k / n with its exact interval, and the count interval of Binomial(n, alpha)."""
    if scored == 0:
        return Rate(
            flagged=0,
            scored=0,
            rate=math.nan,
            ci_low=0.0,
            ci_high=1.0,
            expected_low=0,
            expected_high=0,
            within=True,
        )
    ci = stats.binomtest(flagged, scored).proportion_ci(confidence_level=confidence, method="exact")
    low, high = stats.binom.interval(confidence, scored, alpha)
    return Rate(
        flagged=flagged,
        scored=scored,
        rate=flagged / scored,
        ci_low=float(ci.low),
        ci_high=float(ci.high),
        expected_low=int(low),
        expected_high=int(high),
        within=bool(flagged <= high),
    )


@dataclass(frozen=True, kw_only=True)
class LengthBucket:
    """The documents with `low` <= scored tokens < `high` (None: no upper end) and their rate."""

    low: int
    high: int | None
    rate: Rate

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"scored_tokens_low": self.low, "scored_tokens_high": self.high, **self.rate.to_dict()}


def bucket_edges(min_scored_tokens: int) -> list[int]:
    """Lower edges of the length buckets, in scored tokens, from the key's minimum up."""
    return [min_scored_tokens, *(e for e in _BUCKET_EDGES if e > min_scored_tokens)]


def buckets(
    n_scored: npt.NDArray[np.int64],
    flagged: npt.NDArray[np.bool_],
    *,
    min_scored_tokens: int,
    alpha: float,
    confidence: float,
) -> list[LengthBucket]:
    """Each non-empty length bucket's rate."""
    edges = bucket_edges(min_scored_tokens)
    out = []
    for low, high in zip(edges, [*edges[1:], None], strict=True):
        inside = (n_scored >= low) & (n_scored < high if high is not None else True)
        if inside.any():
            k = int(flagged[inside].sum())
            out.append(
                LengthBucket(
                    low=low, high=high, rate=rate(k, int(inside.sum()), alpha=alpha, confidence=confidence)
                )
            )
    return out


@dataclass(frozen=True, kw_only=True)
class Uniformity:
    """The one-sided KS test of the p-values against Unif(0, 1) (see the module doc).

    Attributes:
        n: p-values tested.
        statistic: D+ = max over x of (empirical CDF(x) - x).
        p_value: its p-value (NaN when n = 0); small means p-values smaller than uniform.
        at_one: the share of p-values equal to 1 (conservative readings, texts with no evidence).
    """

    n: int
    statistic: float
    p_value: float
    at_one: float
    alternative: str = "greater"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as None)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def uniformity(p_values: Sequence[float] | npt.NDArray[np.float64]) -> Uniformity:
    """One-sided KS test (alternative "greater") of `p_values` against Unif(0, 1)."""
    p = np.asarray(p_values, dtype=np.float64)
    if len(p) == 0:
        return Uniformity(n=0, statistic=math.nan, p_value=math.nan, at_one=math.nan)
    test = stats.kstest(p, "uniform", alternative="greater")
    return Uniformity(
        n=len(p), statistic=float(test.statistic), p_value=float(test.pvalue), at_one=float(np.mean(p >= 1.0))
    )
