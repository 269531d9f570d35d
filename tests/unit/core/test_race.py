"""The exponential race and MPFR: exact marginals, i.i.d. draws, and the shared first arrival."""

from __future__ import annotations

import hashlib

import numpy as np
from scipy import stats

from wmark.prf import seed_uniforms
from wmark.race import mpfr_draws, race_winner

# Chi-square tests below reject at p < 1e-4: with a handful of seeded tests the chance that a
# correct sampler fails any of them is < 1e-3, while a biased one (TV >= 0.02 at these sample
# sizes) gives chi-square statistics far beyond the threshold.
P_REJECT = 1e-4


def _probs(rng: np.random.Generator, k: int) -> np.ndarray:
    p = rng.dirichlet(np.full(k, 0.7))
    p[rng.integers(k)] = 0.0  # one token outside the support must never win
    return p / p.sum()


def test_race_winner_frequencies_match_p():
    rng = np.random.default_rng(0)
    p = _probs(rng, 8)
    n = 40_000
    counts = np.zeros(8)
    for i in range(n):
        seed = hashlib.sha256(i.to_bytes(8, "big")).digest()  # one "context" per trial
        counts[race_winner(p, seed_uniforms(seed, np.arange(8)))] += 1
    support = p > 0
    assert counts[~support].sum() == 0
    _, pval = stats.chisquare(counts[support], n * p[support])
    assert pval > P_REJECT


def test_mpfr_draws_are_iid_from_r():
    rng = np.random.default_rng(1)
    r = _probs(rng, 6)
    n_draws, trials = 4, 20_000
    draws = np.empty((trials, n_draws), dtype=np.int64)
    for i in range(trials):
        seed = hashlib.sha256(b"mpfr" + i.to_bytes(8, "big")).digest()
        u = seed_uniforms(seed, np.arange(6)[:, None], np.arange(1, n_draws + 1)[None, :])
        draws[i] = mpfr_draws(r, u)
    support = np.flatnonzero(r > 0)
    # Each of the n draws, taken alone, is distributed as R.
    for d in range(n_draws):
        counts = np.bincount(draws[:, d], minlength=6)
        assert counts[r == 0].sum() == 0
        assert stats.chisquare(counts[support], trials * r[support]).pvalue > P_REJECT
    # Draws are independent: the pair (first, last) follows R x R.
    pair = np.zeros((6, 6))
    np.add.at(pair, (draws[:, 0], draws[:, -1]), 1)
    expected = trials * np.outer(r, r)
    mask = expected > 0
    assert stats.chisquare(pair[mask], expected[mask]).pvalue > P_REJECT


def test_first_mpfr_draw_is_the_race_winner():
    rng = np.random.default_rng(2)
    for i in range(2000):
        r = _probs(rng, 10)
        seed = hashlib.sha256(b"j1" + i.to_bytes(8, "big")).digest()
        n = int(rng.integers(1, 9))
        u = seed_uniforms(seed, np.arange(10)[:, None], np.arange(1, n + 1)[None, :])
        assert mpfr_draws(r, u)[0] == race_winner(r, u[:, 0])


def test_race_with_the_same_uniforms_couples_two_distributions():
    # The Poisson matching lemma bound: P[winner(P) = winner(Q)] >= sum_v P Q / (P + Q).
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    trials = 20_000
    same = 0
    for i in range(trials):
        u = seed_uniforms(hashlib.sha256(b"pq" + i.to_bytes(8, "big")).digest(), np.arange(6))
        same += race_winner(p, u) == race_winner(q, u)
    bound = float(np.sum(p * q / (p + q)))
    # Binomial sd of the empirical rate <= 0.5/sqrt(2e4) = 0.0035; allow 4 sd below the bound.
    assert same / trials >= bound - 0.014
