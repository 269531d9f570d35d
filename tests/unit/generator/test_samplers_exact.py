"""Exactness of every sampler on a fake LM with known distributions, averaged over keys.

Each emitted token must be distributed as the target P whatever the drafter Q, and MPFR's
acceptance at a context must reach Theorem 5.1's bound 1 - sum_i P_i (P_i / (P_i + Q_i))^B.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM

P = np.array([0.34, 0.22, 0.16, 0.12, 0.09, 0.05, 0.02])
Q = np.array([0.10, 0.35, 0.05, 0.25, 0.05, 0.05, 0.15])
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=len(P)))
PREFIX_SPEC = WatermarkSpec(tokenizer=SPEC.tokenizer, context_mode="prefix")
# Reject at p < 1e-4: over the ~50 chi-square tests here a correct sampler fails any with
# probability < 0.5%. With 3000 keys a bias of TV = 0.05 gives a noncentrality of ~70 against a
# critical value of 28 (6 dof): such a sampler fails essentially always.
P_REJECT = 1e-4
N_KEYS = 3000
N_KEYS_BOUND = 2000


def _key(i: int, spec: WatermarkSpec = SPEC) -> KeyMaterial:
    return KeyMaterial(key_id=f"k{i}", secret=Secret(hashlib.sha256(b"exact%d" % i).digest()), spec=spec)


METHODS = [
    ("basic-uwm", 1, 1),
    ("pfr", 1, 3),
    ("pfr-nowm", 1, 3),
    ("mpfr", 2, 3),
    ("mpfr", 4, 2),
    ("mpfr", 8, 1),
]


@pytest.mark.parametrize(
    "method,drafts,lookahead", METHODS, ids=[f"{m}-B{b}-L{ell}" for m, b, ell in METHODS]
)
def test_emitted_tokens_follow_the_target_over_keys(method, drafts, lookahead):
    _check_follows_target(method, drafts, lookahead, SPEC)


@pytest.mark.parametrize("method,drafts,lookahead", [("pfr", 1, 3), ("mpfr", 4, 2)])
def test_prefix_labels_keep_the_output_exact(method, drafts, lookahead):
    _check_follows_target(method, drafts, lookahead, PREFIX_SPEC)  # the paper's labels


def _check_follows_target(method: str, drafts: int, lookahead: int, spec: WatermarkSpec) -> None:
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    config = SamplerConfig(
        method=method, drafts=drafts, lookahead=lookahead, max_new_tokens=6, diversity_bits=0
    )
    counts = np.zeros((6, len(P)))
    for i in range(N_KEYS):
        out = generate(target, [1, 2, 3, 4], config=config, key=_key(i, spec), drafter=drafter, seed=i)
        for pos, tok in enumerate(out.token_ids):
            counts[pos, tok] += 1
    # Positions are tested one at a time: across keys each position's token is independent.
    for pos in range(6):
        assert stats.chisquare(counts[pos], N_KEYS * P).pvalue > P_REJECT, (pos, counts[pos])


def test_context_dependent_target_is_reproduced_jointly():
    rng = np.random.default_rng(3)
    table_p = rng.dirichlet(np.full(5, 0.8), size=5)
    table_q = rng.dirichlet(np.full(5, 0.8), size=5)
    target, drafter = FakeLM.markov(table_p), FakeLM.markov(table_q)
    config = SamplerConfig(method="mpfr", drafts=3, lookahead=2, max_new_tokens=2, diversity_bits=0)
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=5))
    pairs = np.zeros((5, 5))
    for i in range(N_KEYS):
        key = KeyMaterial(key_id="k", secret=Secret(hashlib.sha256(b"markov%d" % i).digest()), spec=spec)
        out = generate(target, [0, 1, 2, 3], config=config, key=key, drafter=drafter, seed=i)
        pairs[out.token_ids[0], out.token_ids[1]] += 1
    expected = N_KEYS * table_p[3][:, None] * table_p  # P(y0 | 3) P(y1 | y0)
    assert stats.chisquare(pairs.ravel(), expected.ravel()).pvalue > P_REJECT


@pytest.mark.parametrize("drafts", [1, 2, 4, 8])
def test_mpfr_acceptance_reaches_theorem_5_1(drafts):
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    config = SamplerConfig(method="mpfr", drafts=drafts, lookahead=1, max_new_tokens=2, diversity_bits=0)
    accepted = 0
    for i in range(N_KEYS_BOUND):
        out = generate(target, [1, 2, 3, 4], config=config, key=_key(i), drafter=drafter, seed=i)
        accepted += out.blocks[0] == 2  # the root's target winner was among the drafts
    bound = 1 - np.sum(P * (P / (P + Q)) ** drafts)
    # The rate has binomial sd <= 0.5/sqrt(2000) = 0.0112; 4 sd below the bound would be a real miss.
    assert accepted / N_KEYS_BOUND >= bound - 0.045, (accepted / N_KEYS_BOUND, bound)


def test_acceptance_rises_with_drafts():
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    rates = []
    for drafts in (1, 2, 4, 8):
        config = SamplerConfig(
            method="mpfr",
            drafts=drafts,
            lookahead=4,
            draft_confidence=0.0,
            max_new_tokens=40,
            diversity_bits=0,
        )
        outs = [
            generate(target, [1, 2, 3, 4], config=config, key=_key(i), drafter=drafter, seed=i)
            for i in range(200)
        ]
        rates.append(np.mean([o.aatps for o in outs]))
    assert rates == sorted(rates) and rates[-1] > rates[0] + 0.5, rates
