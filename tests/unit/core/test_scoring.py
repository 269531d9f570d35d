"""Scores and p-values: the exact Gamma tail against scipy and mpmath, Chernoff bounds are
conservative, and H0 p-values are uniform."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import special, stats

from wmark.scoring import SCORES, log_gamma_sf, score_pivots


@pytest.mark.parametrize("n", [1, 2, 5, 16, 100, 1000, 20_000])
def test_gamma_tail_equals_gammaincc_where_finite(n):
    for s in np.linspace(0.01, 3 * n + 30, 40):
        expected = float(special.gammaincc(n, s))
        if expected > 1e-300:
            assert math.isclose(math.exp(log_gamma_sf(n, s)), expected, rel_tol=1e-9, abs_tol=1e-300)


@pytest.mark.parametrize("n,s", [(1, 800.0), (10, 900.0), (200, 1500.0), (5000, 9000.0), (100, 100_000.0)])
def test_gamma_tail_stays_exact_far_below_1e_300(n, s):
    assert special.gammaincc(n, s) < 1e-300  # scipy has underflowed or is about to
    mpmath.mp.dps = 50
    expected = float(mpmath.log(mpmath.gammainc(n, s, mpmath.inf, regularized=True)))
    assert expected < math.log(1e-300)
    assert math.isclose(log_gamma_sf(n, s), expected, rel_tol=1e-10)


def test_gamma_tail_edges():
    assert log_gamma_sf(0, 5.0) == 0.0
    assert log_gamma_sf(10, 0.0) == 0.0
    assert log_gamma_sf(3, 1e-12) == pytest.approx(0.0, abs=1e-30)


@pytest.mark.parametrize("score", ["u", "li", "pl"])
def test_chernoff_p_values_are_conservative(score):
    # Monte-Carlo tail of the H0 score sum vs the bound: the bound must not be below the truth.
    rng = np.random.default_rng(4)
    n, sims = 30, 20_000
    null = np.array([score_pivots(rng.random(n), score).score for _ in range(sims)])
    for q in (0.9, 0.99, 0.999):
        threshold = float(np.quantile(null, q))
        pivots = _pivots_with_score(score, n, threshold)
        bound = score_pivots(pivots, score).p_value
        empirical = float(np.mean(null >= threshold))
        # The empirical tail has binomial sd sqrt(q(1-q)/sims) <= 0.0035; allow 4 sd.
        assert bound >= empirical - 4 * math.sqrt(empirical * (1 - empirical) / sims) - 1e-12


def _pivots_with_score(score: str, n: int, target: float) -> np.ndarray:
    # Equal pivots whose score sum hits `target` (bisection on the common value).
    lo, hi = 1e-9, 1 - 1e-9
    for _ in range(200):
        mid = (lo + hi) / 2
        if score_pivots(np.full(n, mid), score).score < target:
            lo = mid
        else:
            hi = mid
    return np.full(n, hi)


@pytest.mark.parametrize("score", SCORES)
def test_h0_p_values_do_not_exceed_alpha_rate(score):
    rng = np.random.default_rng(5)
    sims, n = 4000, 50
    p = np.array([score_pivots(rng.random(n), score).p_value for _ in range(sims)])
    for alpha in (0.01, 0.05, 0.2):
        rate = float(np.mean(p <= alpha))
        # Upper 99.99% binomial quantile: a valid test must stay below it.
        assert rate <= stats.binom.ppf(0.9999, sims, alpha) / sims
    if score == "aaronson":  # exact: also not conservative, rate within the two-sided interval
        lo, hi = stats.binom.interval(0.9999, sims, 0.05)
        assert lo <= np.sum(p <= 0.05) <= hi


def test_watermark_like_pivots_score_high_and_unknown_score_is_refused():
    rng = np.random.default_rng(6)
    strong = 1 - rng.random(200) ** 3  # pivots pushed towards 1
    for score in SCORES:
        res = score_pivots(strong, score)
        assert res.log_p < math.log(1e-6)
        assert res.anlppt > 0
    with pytest.raises(ValueError, match="unknown score"):
        score_pivots(strong, "nope")  # type: ignore[arg-type]


def test_pl_mgf_quadrature_matches_adaptive_integration():
    from scipy import integrate

    from wmark.scoring import PL_EPSILON, _pl_log_mgf

    c = 2 - math.sqrt(PL_EPSILON)
    for lam in (0.0, 0.1, 1.0, 3.0, 10.0):
        head = PL_EPSILON * math.exp(lam * (PL_EPSILON**-0.5 - c))
        tail = integrate.quad(
            lambda w, lam=lam: math.exp(lam * (w**-0.5 - c)), PL_EPSILON, 1.0, epsabs=0, epsrel=1e-13
        )[0]
        assert math.isclose(_pl_log_mgf(lam), math.log(head + tail), rel_tol=1e-11, abs_tol=1e-13)
