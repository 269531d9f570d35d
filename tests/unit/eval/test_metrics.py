"""The evaluation's figures: worked examples, oracles (scipy, the production detector), H0 calibration
of mse-pseudo's mixed pivot, and the tau fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from wmark.detector import key_pivots
from wmark.eval.detection import (
    TextPivots,
    cross_validate_tau,
    fit_tau,
    mixed_pivots,
    text_pivots,
)
from wmark.eval.metrics import (
    binomial_interval,
    log_p_at,
    lppl,
    mean_std,
    pooled_aatps,
    pooled_anlppt,
    rouge_l,
    scores,
    standard_error,
)
from wmark.generator.baselines.pseudo import acceptance_uniform, second_key
from wmark.prf import KeyedSource, seed_uniforms
from wmark.scoring import score_pivots


def test_rouge_l_worked_examples():
    assert rouge_l([1, 2, 3], [1, 2, 3]) == 1.0
    assert rouge_l([1, 2, 3], [4, 5]) == 0.0
    assert rouge_l([], [1]) == 0.0
    # LCS of (1 2 3 4 5) and (1 3 5 7) is (1 3 5): F1 = 2 * 3 / (5 + 4)
    assert rouge_l([1, 2, 3, 4, 5], [1, 3, 5, 7]) == pytest.approx(6 / 9)
    # order matters: (3 2 1) vs (1 2 3) share only one token in order
    assert rouge_l([3, 2, 1], [1, 2, 3]) == pytest.approx(2 / 6)


def test_lppl_drops_non_finite_terms():
    mean, dropped = lppl([0.5, 0.25, 0.0])
    assert mean == pytest.approx((math.log(2) + math.log(4)) / 2) and dropped == 1
    assert math.isnan(lppl([0.0])[0])


def test_log_p_at_truncates_to_the_first_t_generated_tokens():
    positions, pivots = [0, 1, 5, 9], [0.9, 0.8, 0.99, 0.7]
    lp, n = log_p_at(positions, pivots, 6)
    total = -math.log(0.1) - math.log(0.2) - math.log(0.01)
    assert n == 3 and lp == pytest.approx(math.log(special.gammaincc(3, total)))
    assert log_p_at(positions, pivots, 100) == pytest.approx(
        (score_pivots(np.array(pivots), "aaronson").log_p, 4)
    )
    assert log_p_at(positions, pivots, 0) == (0.0, 0)


def test_scores_are_the_core_scores():
    u = np.random.default_rng(0).uniform(size=50) ** 0.5
    out = scores(u)
    assert set(out) == {"aaronson", "u", "li", "pl"}
    assert out["u"] == score_pivots(u, "u").log_p


def test_binomial_interval_matches_clopper_pearson():
    iv = binomial_interval(0, 24)
    assert iv.low == 0.0 and iv.high == pytest.approx(1 - 0.025 ** (1 / 24))
    iv = binomial_interval(7, 50)
    assert iv.low == pytest.approx(stats.beta.ppf(0.025, 7, 44))
    assert iv.high == pytest.approx(stats.beta.ppf(0.975, 8, 43))
    assert iv.contains(0.14) and not iv.contains(0.01)


def test_summary_statistics():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([5.0]) == (5.0, 0.0)
    assert standard_error([1.0, 2.0, 3.0]) == pytest.approx(1 / math.sqrt(3))
    assert pooled_aatps([[1, 3], [2]]) == 2.0
    assert pooled_anlppt([-10.0, -20.0], [10, 20]) == 1.0


def test_text_pivots_read_the_prompt_tail_and_the_second_key(word_key, planted):
    rng = np.random.default_rng(4)
    ids = planted(word_key, 120, rng)
    ids = ids + ids[10:40]  # repeated windows: masked in both
    prompt = [int(x) for x in rng.integers(1, 400, size=9)]
    source = KeyedSource(word_key.secret, word_key.spec)
    ours = text_pivots(prompt, ids, source)
    theirs = key_pivots(np.array(prompt + ids, dtype=np.uint32), source, start=len(prompt))
    assert ours.positions.tolist() == (theirs.positions - len(prompt)).tolist()
    assert np.array_equal(ours.u1, theirs.pivots)
    # the second key's pivots and acceptance uniforms, recomputed one by one
    k2 = second_key(source)
    text = prompt + ids
    for t, u2, r in zip(ours.positions[:20], ours.u2[:20], ours.r[:20], strict=True):
        seed = k2.seed(text[len(prompt) + t - 4 : len(prompt) + t])
        assert u2 == seed_uniforms(seed, text[len(prompt) + t]) and r == acceptance_uniform(seed)


def test_second_key_depends_on_the_first_and_differs_from_it(word_key, word_spec):
    from wmark import Secret

    source = KeyedSource(word_key.secret, word_spec)
    other = KeyedSource(Secret(b"x" * 32), word_spec)
    window = (1, 2, 3, 4)
    assert second_key(source).seed(window) == second_key(source).seed(window)
    assert len({source.seed(window), second_key(source).seed(window), second_key(other).seed(window)}) == 3


def test_mixed_pivot_keeps_the_h0_false_positive_rate():
    # Under H0, U1, U2 and r are independent uniforms: for any tau the mixed pivots are uniform, so
    # the exact Gamma test at alpha = 0.01 over 4000 texts of 40 positions flags 40 +- 6.3
    # (binomial sd); 5 sd either side is [8, 72].
    rng = np.random.default_rng(7)
    for tau in (0.0, 0.3, 0.5, 0.9):
        hits = 0
        for _ in range(4000):
            u1, u2, r = rng.uniform(size=(3, 40))
            hits += log_p_at(np.arange(40), mixed_pivots(u1, u2, r, tau), 40)[0] <= math.log(0.01)
        assert 8 <= hits <= 72, (tau, hits)


def _synthetic(rng: np.random.Generator, n: int, cut: float) -> TextPivots:
    """Texts whose evidence sits in U2 where r > cut (a residual keyed by k2 there)."""
    r = rng.uniform(size=n)
    u2 = np.where(r > cut, 1 - rng.uniform(size=n) * 0.05, rng.uniform(size=n))
    return TextPivots(np.arange(n), rng.uniform(size=n), u2, r)


def test_fitted_tau_finds_where_the_evidence_is():
    rng = np.random.default_rng(1)
    texts = [_synthetic(rng, 24, 0.7) for _ in range(40)]
    tau = fit_tau(texts, 24, 0.01)
    assert 0.55 <= tau <= 0.8
    fit = cross_validate_tau(texts, 24, 0.01, splits=4)
    assert len(fit.taus) == 4 and all(0.55 <= t <= 0.8 for t in fit.taus)
    # ~7 of 24 positions carry strong evidence: most held-out texts are detected; with U1 alone
    # (no evidence) 40 texts give 0.4 false detections on average, so 3 or fewer
    assert min(fit.tpr) > 0.6
    assert sum(log_p_at(t.positions, t.u1, 24)[0] <= math.log(0.01) for t in texts) <= 3
    with pytest.raises(ValueError):
        cross_validate_tau(texts[:1], 24, 0.01)


def test_empirical_threshold_admits_at_most_alpha_of_the_negatives():
    from wmark.eval.aggregate import empirical_threshold

    negatives = [-float(i) for i in range(250)]  # ln p = 0, -1, ..., -249
    threshold = empirical_threshold(negatives, alpha=0.01)
    # floor(0.01 * 250) = 2 negatives may fall strictly below: -249 and -248
    assert threshold == -247.0
    assert sum(n < threshold for n in negatives) == 2
    assert empirical_threshold([-3.0, -1.0], alpha=0.01) == -3.0  # too few negatives: none may fall below
    assert math.isnan(empirical_threshold([], alpha=0.01))
