"""Exactness of the baselines on a fake LM with known P and Q, averaged over keys (or seeds).

Every baseline's emitted tokens must follow the target P whatever the drafter Q; the same test
must reject Rowan et al.'s published `gls` stopping rule (a fresh sample of P at the stopping
depth), kept here as a fixture only. `mse` and `vsps` accept a draft with probability exactly
1 - TV(P, Q); `mws` is PFR's race coupling at keyed positions, so it emits PFR's text.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest
from scipy import stats

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.contexts import scored_positions
from wmark.generator.baselines.gls import ListStop, list_sampling_block
from wmark.generator.engine import METHODS, Method, SamplerConfig, generate
from wmark.generator.fakes import FakeLM
from wmark.prf import seed_uniforms
from wmark.race import race_winner

P = np.array([0.34, 0.22, 0.16, 0.12, 0.09, 0.05, 0.02])
Q = np.array([0.10, 0.35, 0.05, 0.25, 0.05, 0.05, 0.15])
TV = 0.5 * np.abs(P - Q).sum()  # 0.39
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=len(P)))
PROMPT = [1, 2, 3, 4]
# Reject at p < 1e-4: over the ~55 chi-square tests below a correct sampler fails one with
# probability < 0.6%. With 2000 keys a bias of TV 0.05 (spread over the 7 tokens) gives a
# noncentrality of ~40 against a critical value of 27.9 (6 dof); the fresh-noise `gls` has TV ~0.1
# at its first position here (noncentrality > 100), so it fails essentially always.
P_REJECT = 1e-4
N_KEYS = 2000
N_TOKENS = 4


def _key(i: int) -> KeyMaterial:
    return KeyMaterial(key_id=f"k{i}", secret=Secret(hashlib.sha256(b"baseline%d" % i).digest()), spec=SPEC)


def _position_counts(method: str, drafts: int, lookahead: int, diversity_bits: float = 0.0) -> np.ndarray:
    config = SamplerConfig(
        method=method,
        drafts=drafts,
        lookahead=lookahead,
        max_new_tokens=N_TOKENS,
        diversity_bits=diversity_bits,
    )
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    counts = np.zeros((N_TOKENS, len(P)))
    for i in range(N_KEYS):
        out = generate(target, PROMPT, config=config, key=_key(i), drafter=drafter, seed=i)
        for pos, tok in enumerate(out.token_ids):
            counts[pos, tok] += 1
    return counts


def _min_p_value(counts: np.ndarray) -> float:
    # Across keys each position's token is independent, so positions are tested one at a time.
    return min(stats.chisquare(row, row.sum() * P).pvalue for row in counts)


CASES = [
    ("vsps", 1, 2, 0.0),
    ("mws", 1, 3, 0.0),
    ("mws", 1, 2, 3.0),  # diversity prefix: drafter and target may see different clock kinds
    ("mse", 1, 3, 0.0),
    ("mse-pseudo", 1, 3, 0.0),
    ("gls", 2, 2, 0.0),
    ("gls", 4, 3, 0.0),
]


@pytest.mark.parametrize(
    "method,drafts,lookahead,bits", CASES, ids=[f"{m}-B{b}-L{ell}-div{d:g}" for m, b, ell, d in CASES]
)
def test_baseline_tokens_follow_the_target_over_keys(method, drafts, lookahead, bits):
    assert _min_p_value(_position_counts(method, drafts, lookahead, bits)) > P_REJECT


def _fresh_noise_stop(stop: ListStop) -> int:
    """Rowan et al.'s code: at the stopping depth, a fresh Gumbel-max sample of P (biased)."""
    seed = stop.policy.free.seed(len(stop.prefix), (0xFFFFFFF0,))
    return int(stop.p.ids[race_winner(stop.p.probs, seed_uniforms(seed, stop.p.ids))])


@pytest.fixture()
def gls_fresh(monkeypatch: pytest.MonkeyPatch) -> str:
    block = functools.partial(list_sampling_block, at_stop=_fresh_noise_stop)
    monkeypatch.setitem(METHODS, "gls-fresh", Method(block, keyed=False, speculative=True, multi_draft=True))
    return "gls-fresh"


def test_the_same_test_rejects_gls_with_fresh_noise_correction(gls_fresh):
    assert _min_p_value(_position_counts(gls_fresh, 2, 2)) < P_REJECT


def test_fresh_noise_correction_changes_tokens_not_block_lengths(gls_fresh):
    # The stopping rule only picks the emitted token: the first block ends at the same depth.
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    changed = 0
    for seed in range(200):
        runs = [
            generate(
                target,
                PROMPT,
                config=SamplerConfig(method=m, drafts=2, lookahead=2, max_new_tokens=3),
                drafter=drafter,
                seed=seed,
            )
            for m in ("gls", gls_fresh)
        ]
        assert runs[0].blocks[0] == runs[1].blocks[0]
        changed += runs[0].token_ids != runs[1].token_ids
    assert changed > 20  # it is a different sampler, not a no-op


JOINT = [("vsps", 1), ("mws", 1), ("mse", 1), ("mse-pseudo", 1), ("gls", 3)]


@pytest.mark.parametrize("method,drafts", JOINT, ids=[m for m, _ in JOINT])
def test_context_dependent_target_is_reproduced_across_blocks(method, drafts):
    # A Markov target and drafter: the first two tokens jointly, and each later token's marginal
    # (pi_t = pi_0 T^t), over 6 tokens with L = 2, so several blocks and block boundaries.
    rng = np.random.default_rng(3)
    table_p = rng.dirichlet(np.full(5, 0.8), size=5)
    table_q = rng.dirichlet(np.full(5, 0.8), size=5)
    target, drafter = FakeLM.markov(table_p), FakeLM.markov(table_q)
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=5))
    config = SamplerConfig(method=method, drafts=drafts, lookahead=2, max_new_tokens=6, diversity_bits=0)
    n = 1500
    pairs, later = np.zeros((5, 5)), np.zeros((4, 5))
    for i in range(n):
        key = KeyMaterial(key_id="k", secret=Secret(hashlib.sha256(b"joint%d" % i).digest()), spec=spec)
        out = generate(target, [0, 1, 2, 3], config=config, key=key, drafter=drafter, seed=i)
        pairs[out.token_ids[0], out.token_ids[1]] += 1
        for t in range(2, 6):
            later[t - 2, out.token_ids[t]] += 1
    expected = n * table_p[3][:, None] * table_p  # P(y0 | 3) P(y1 | y0)
    # Cells with expectation < 5 are merged into one so the chi-square law holds.
    small = expected.ravel() < 5
    obs = np.append(pairs.ravel()[~small], pairs.ravel()[small].sum())
    exp = np.append(expected.ravel()[~small], expected.ravel()[small].sum())
    assert stats.chisquare(obs, exp).pvalue > P_REJECT
    marginal = table_p[3] @ table_p  # the law of y1
    for row in later:
        marginal = marginal @ table_p
        assert stats.chisquare(row, n * marginal).pvalue > P_REJECT


@pytest.mark.parametrize("method", ["mse", "vsps"])
def test_acceptance_is_one_minus_tv(method):
    config = SamplerConfig(method=method, lookahead=1, max_new_tokens=2, diversity_bits=0)
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    accepted = sum(
        generate(target, PROMPT, config=config, key=_key(i), drafter=drafter, seed=i).blocks[0] == 2
        for i in range(N_KEYS)
    )
    rate = accepted / N_KEYS
    # Binomial sd at 1 - TV = 0.61: sqrt(0.61 * 0.39 / 2000) = 0.0109; 4.5 sd = 0.049.
    assert abs(rate - (1 - TV)) < 0.049, rate


def test_mws_is_pfr_race_coupling_at_keyed_positions():
    # Race coupling accepts with probability >= (1 - TV)/(1 + TV) = 0.44 and in fact well above
    # mse's 1 - TV here; mws must accept exactly when pfr does, key by key. Both draft L levels
    # (draft_confidence 0): mws, like the other baselines, has no dynamic lookahead.
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    same_text = 0
    for i in range(300):
        runs = {
            m: generate(
                target,
                PROMPT,
                config=SamplerConfig(
                    method=m, lookahead=3, draft_confidence=0.0, max_new_tokens=12, diversity_bits=0
                ),
                key=_key(i),
                drafter=drafter,
                seed=i,
            )
            for m in ("pfr", "mws")
        }
        pfr, mws = runs["pfr"], runs["mws"]
        first_masked = min([*pfr.masked_positions, *mws.masked_positions, 12])
        assert pfr.token_ids[:first_masked] == mws.token_ids[:first_masked]
        if first_masked == 12:
            assert pfr.blocks == mws.blocks
            same_text += 1
    assert same_text > 150  # most texts never repeat a window, and are then identical


@pytest.mark.parametrize("method", ["vsps", "mws", "mse", "mse-pseudo", "gls"])
def test_generator_mask_equals_the_detector_mask(method):
    # A low-entropy Markov LM repeats itself, so many windows recur and get masked.
    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.full(12, 0.15), size=12)
    target, drafter = FakeLM.markov(table), FakeLM.markov(rng.dirichlet(np.full(12, 0.15), size=12))
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="2" * 64, vocab_size=12))
    key = KeyMaterial(key_id="k", secret=Secret(b"m" * 32), spec=spec)
    prompt = [1, 2, 3, 4, 5, 6]
    for seed in range(3):
        out = generate(
            target,
            prompt,
            config=SamplerConfig(method=method, max_new_tokens=120),
            key=key,
            drafter=drafter,
            seed=seed,
        )
        assert out.target_forwards == len(out.blocks) and sum(out.blocks) == len(out.token_ids)
        text = np.array(prompt + list(out.token_ids), dtype=np.uint32)
        masked = [t - len(prompt) for t in scored_positions(text, 4, start=len(prompt)).masked]
        if METHODS[method].keyed:
            assert masked == list(out.masked_positions) and len(masked) > 10
        else:
            assert out.masked_positions == () and out.key_id is None


def test_same_seed_reproduces_baselines():
    target, drafter = FakeLM.fixed(P), FakeLM.fixed(Q)
    for method in ("vsps", "mse", "mse-pseudo", "gls"):
        config = SamplerConfig(method=method, lookahead=3, max_new_tokens=20)
        a, b, c = (
            generate(target, PROMPT, config=config, key=_key(0), drafter=drafter, seed=s) for s in (5, 5, 6)
        )
        assert a.token_ids == b.token_ids and a.blocks == b.blocks
        assert a.token_ids != c.token_ids  # the fresh randomness comes from the seed
