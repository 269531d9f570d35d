"""Scores of pivots and their p-values [docs/algorithms.md §7].

Under H0 (text independent of the key) the pivots of scored positions are i.i.d. Unif(0, 1).

- Aaronson: s = -ln(1 - U) ~ Exp(1), so the sum over n positions is Gamma(n, 1) and the
  p-value is its exact upper tail, computed in log space (`log_gamma_sf`): right far below
  1e-300, where `scipy.special.gammaincc` underflows to 0.
- U (Hu & Huang), Li (Li et al. 2025, Δ), PL (Lattimore 2026, ε): Chernoff bounds
  log p <= n * min_{λ >= 0} [Λ(λ) - λ * mean score], with Λ the H0 log-MGF of one score.
  These are conservative (never below the true p); they exist for ANLPPT comparisons.

ANLPPT = -ln(p) / n_scored (natural log), the per-token evidence used in evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

__all__ = [
    "SCORES",
    "ScoreName",
    "ScoreResult",
    "aaronson_scores",
    "chernoff_log_p",
    "log_gamma_sf",
    "log_gamma_sf_many",
    "log_gamma_tail",
    "score_pivots",
]

ScoreName = Literal["aaronson", "u", "li", "pl"]
SCORES: tuple[ScoreName, ...] = ("aaronson", "u", "li", "pl")
LI_DELTA = 0.5  # the Li score is implemented for this Δ (closed-form MGF)
PL_EPSILON = 0.1
_TINY = 1e-250  # below this gammaincc loses relative precision: the exact log series takes over
_LOG_TINY = math.log(_TINY)


def log_gamma_sf(n: int, s: float) -> float:
    """ln Q(n, s): log of the upper tail of Gamma(n, 1) at s, for integer n >= 0.

    Uses `gammaincc` while it is comfortably above underflow, else the exact finite series
    Q(n, s) = e^{-s} sum_{k<n} s^k / k! summed with log-sum-exp.
    """
    if n <= 0 or s <= 0.0:
        return 0.0
    p = float(special.gammaincc(n, s))
    if p > _TINY:
        return math.log(p)
    k = np.arange(n, dtype=np.float64)
    terms = k * math.log(s) - special.gammaln(k + 1.0)
    return float(-s + special.logsumexp(terms))


def log_gamma_sf_many(n: npt.ArrayLike, s: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """`log_gamma_sf` elementwise over arrays of (n, s) pairs: vectorised where `gammaincc` is exact.

    The window search scores thousands of windows per document; only the few whose tail is
    near underflow take the exact series.
    """
    n_arr = np.asarray(n, dtype=np.int64)
    s_arr = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = np.log(special.gammaincc(n_arr, s_arr))
    out[(n_arr <= 0) | (s_arr <= 0.0)] = 0.0
    for i in np.flatnonzero(out < _LOG_TINY):
        out[i] = log_gamma_sf(int(n_arr[i]), float(s_arr[i]))
    return out


def aaronson_scores(pivots: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Per-token Aaronson scores s_t = -ln(1 - U_t): Exp(1) under H0."""
    out: npt.NDArray[np.float64] = -np.log1p(-np.asarray(pivots, dtype=np.float64))
    return out


def log_gamma_tail(shape: float, s: float) -> float:
    """ln Q(shape, s) for any real shape > 0: the Gamma tail of a moment-matched statistic.

    Integer shapes take `log_gamma_sf`. Otherwise `gammaincc` while it is comfortably above
    underflow, else Legendre's continued fraction for Q (DLMF 8.9.2) evaluated by the modified
    Lentz method, in log space; there s > shape, where the fraction converges in a few terms.
    """
    if shape <= 0.0 or s <= 0.0:
        return 0.0
    if float(shape).is_integer():
        return log_gamma_sf(int(shape), s)
    p = float(special.gammaincc(shape, s))
    if p > 1e-250:
        return math.log(p)
    tiny = 1e-300
    b = s + 1.0 - shape
    c, d = 1.0 / tiny, 1.0 / b
    fraction = d
    for i in range(1, 10_000):
        a_i = -i * (i - shape)
        b += 2.0
        d = a_i * d + b
        d = tiny if abs(d) < tiny else d
        c = b + a_i / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = c * d
        fraction *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return -s + shape * math.log(s) - float(special.gammaln(shape)) + math.log(fraction)


def chernoff_log_p(n: int, mean_score: float, log_mgf: Callable[[float], float], h0_mean: float) -> float:
    """Chernoff bound on ln P(mean of n H0 scores >= mean_score); 0 when mean_score <= h0_mean."""
    if n <= 0 or mean_score <= h0_mean:
        return 0.0
    result = optimize.minimize_scalar(
        lambda lam: log_mgf(lam) - lam * mean_score,
        bounds=(0.0, 1e4),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return float(min(0.0, n * result.fun))


def _u_log_mgf(lam: float) -> float:
    # ln E[e^{λU}] = ln((e^λ - 1)/λ), written to stay finite for large λ.
    if lam < 1e-8:
        return lam / 2.0
    return lam + math.log1p(-math.exp(-lam)) - math.log(lam)


def _li_score(u: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Li et al.'s h_Δ(U) = ln(k U^{Δ/(1-Δ)} + 1{q>0} U^{(1-q)/q}) with k = ⌊1/(1-Δ)⌋, q = 1 - k(1-Δ);
    # at Δ = 0.5, k = 2 and q = 0, so h = ln 2 + ln U.
    return math.log(2.0) + np.log(u)


def _li_log_mgf(lam: float) -> float:
    # E[e^{λ(ln 2 + ln U)}] = 2^λ / (1 + λ)
    return lam * math.log(2.0) - math.log1p(lam)


def _pl_score(u: npt.NDArray[np.float64], eps: float = PL_EPSILON) -> npt.NDArray[np.float64]:
    w = np.maximum(1.0 - u, 1e-300)
    out: npt.NDArray[np.float64] = np.minimum(eps**-0.5, w**-0.5) - (2.0 - math.sqrt(eps))
    return out


# Gauss-Legendre nodes on x = w^{-1/2} in [1, ε^{-1/2}]: the integrand there is smooth, and 64
# nodes integrate it to double precision (checked against scipy.integrate.quad in the tests).
_PL_X, _PL_W = np.polynomial.legendre.leggauss(64)
_PL_HI = 1.0 / math.sqrt(PL_EPSILON)
_PL_NODES = 1.0 + (_PL_X + 1.0) * (_PL_HI - 1.0) / 2.0
_PL_WEIGHTS = _PL_W * (_PL_HI - 1.0) / 2.0 * 2.0 * _PL_NODES**-3.0  # dw = 2 x^-3 dx


def _pl_log_mgf(lam: float) -> float:
    # E[e^{λh}] = ε e^{λ(ε^{-1/2} - c)} + ∫_ε^1 e^{λ(w^{-1/2} - c)} dw, c = 2 - √ε; the peak
    # e^{λ(ε^{-1/2} - c)} is factored out so large λ stays finite.
    c = 2.0 - math.sqrt(PL_EPSILON)
    peak = lam * (_PL_HI - c)
    tail = float(np.sum(_PL_WEIGHTS * np.exp(lam * (_PL_NODES - c) - peak)))
    return peak + math.log(PL_EPSILON + tail)


@dataclass(frozen=True)
class ScoreResult:
    """A test statistic and its p-value.

    Attributes:
        score: sum of per-token scores.
        log_p: natural log of the p-value (exact for Aaronson, a Chernoff bound otherwise).
        n: number of scored positions.
    """

    score: float
    log_p: float
    n: int

    @property
    def p_value(self) -> float:
        """The p-value (0.0 when it underflows a float; `log_p` stays exact)."""
        return math.exp(self.log_p)

    @property
    def anlppt(self) -> float:
        """Average negative log p-value per scored token."""
        return -self.log_p / self.n if self.n else 0.0


def score_pivots(pivots: npt.NDArray[np.float64], score: ScoreName = "aaronson") -> ScoreResult:
    """Score n pivots and compute the p-value of the sum under H0.

    Args:
        pivots: (n,) float64 pivots U_t of the scored positions.
        score: "aaronson" (exact Gamma tail), "u", "li" or "pl" (Chernoff bounds).
    """
    u = np.asarray(pivots, dtype=np.float64)
    n = len(u)
    if score == "aaronson":
        total = float(aaronson_scores(u).sum())
        return ScoreResult(total, log_gamma_sf(n, total), n)
    if score == "u":
        total = float(u.sum())
        return ScoreResult(total, chernoff_log_p(n, total / max(n, 1), _u_log_mgf, 0.5), n)
    if score == "li":
        total = float(_li_score(u).sum())
        h0_mean = math.log(2.0) - 1.0
        return ScoreResult(total, chernoff_log_p(n, total / max(n, 1), _li_log_mgf, h0_mean), n)
    if score == "pl":
        total = float(_pl_score(u).sum())
        return ScoreResult(total, chernoff_log_p(n, total / max(n, 1), _pl_log_mgf, 0.0), n)
    raise ValueError(f"unknown score {score!r}; known: {', '.join(SCORES)}")
