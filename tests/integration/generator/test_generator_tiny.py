"""The generator on tiny random transformers (built here, float32): drafter invariance, one target
forward per block, the repeated-window mask shared with the detector, diversity, detection; the
same for prefix-mode keys."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.contexts import scored_positions
from wmark.detector import Detector
from wmark.generator.clocks import ClockKind, ClockPolicy
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM
from wmark.generator.logits import LogitsConfig
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model
from wmark.prf import KeyedSource

VOCAB = 256  # the tiny models of conftest.py
EOS = 0
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=VOCAB))
KEY = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny key").digest()), spec=SPEC)
PROMPT = [17, 42, 99, 3, 250, 7, 7, 128, 64, 5]
MAX_NEW = 40


@pytest.fixture(scope="module")
def models(tiny_trio) -> dict[str, HFModel]:
    return tiny_trio()


def _run(
    models, method, drafts=None, lookahead=4, drafter="close", draft_t=1.0, seed=5, max_new=MAX_NEW, key=KEY
):
    config = SamplerConfig(  # the paper's fixed lookahead: every branch drafts `lookahead` levels
        method=method,
        drafts=drafts,
        lookahead=lookahead,
        draft_confidence=0.0,
        max_new_tokens=max_new,
        draft_logits=LogitsConfig(temperature=draft_t),
    )
    return generate(models["target"], PROMPT, config=config, key=key, drafter=models[drafter], seed=seed)


@pytest.fixture(scope="module")
def reference(models):
    return _run(models, "basic-uwm")


CONFIGS = [("pfr", 1, ell) for ell in (1, 2, 3, 4)] + [
    ("mpfr", b, ell) for b in (1, 2, 4, 8) for ell in (1, 2, 3, 4)
]


@pytest.mark.parametrize(
    "method,drafts,lookahead", CONFIGS, ids=[f"{m}-B{b}-L{ell}" for m, b, ell in CONFIGS]
)
def test_drafter_invariance(models, reference, method, drafts, lookahead):
    assert reference.blocks == (1,) * len(reference.token_ids)
    boundaries = set()
    for drafter in ("close", "unrelated"):
        for draft_t in (1.0, 0.5):
            out = _run(models, method, drafts, lookahead, drafter, draft_t)
            assert out.token_ids == reference.token_ids, (drafter, draft_t)
            assert out.masked_positions == reference.masked_positions
            assert out.target_forwards == len(out.blocks)  # one target forward per block
            assert out.draft_forwards <= lookahead * len(out.blocks)  # one batched drafter forward per level
            boundaries.add(out.blocks)
    assert len(boundaries) > 1  # only block boundaries differ between drafters


def test_close_drafter_accepts_more_and_mpfr_gains_with_drafts(models):
    pfr_close = _run(models, "pfr", 1, 4, "close")
    pfr_unrelated = _run(models, "pfr", 1, 4, "unrelated")
    assert pfr_close.aatps > pfr_unrelated.aatps
    assert _run(models, "mpfr", 8, 4, "unrelated").aatps > pfr_unrelated.aatps


@pytest.mark.parametrize("residual", [False, True])  # a drafter's one part, a target's two
def test_int8_path_is_batch_invariant_too(tiny_qwen, residual):
    base = tiny_qwen(0)
    eos = frozenset({EOS})
    rows = "two" if residual else "one"
    target = HFModel(prepare_model(copy.deepcopy(base), "int8", "cpu", activations=rows), eos)
    decoder = target.plan.decoder
    assert decoder is not None and decoder.exact  # its forwards run the lean decoder
    drafter = HFModel(prepare_model(tiny_qwen(2), "int8", "cpu"), eos)
    ref = generate(
        target, PROMPT, config=SamplerConfig(method="basic-uwm", max_new_tokens=MAX_NEW), key=KEY, seed=5
    )
    for drafts in (1, 4):
        out = generate(
            target,
            PROMPT,
            config=SamplerConfig(method="mpfr", drafts=drafts, max_new_tokens=MAX_NEW),
            key=KEY,
            drafter=drafter,
            seed=5,
        )
        assert out.token_ids == ref.token_ids


def test_tree_verification_is_one_forward_whatever_b(models):
    for drafts in (2, 8):
        out = _run(models, "mpfr", drafts, 3, "unrelated")
        assert out.target_forwards == len(out.blocks)
        assert max(out.drafted) > 3  # a real tree, not a chain, went through that single forward


def test_generation_is_detected_and_the_control_is_not(models):
    marked = _run(models, "mpfr", 4, 4, max_new=160)
    control = _run(models, "pfr-nowm", 1, 4, max_new=160)
    detector = Detector([KEY])
    result = detector.detect(token_ids=list(marked.token_ids))
    assert result.verdict == "watermarked" and result.p_value < 1e-4
    assert detector.detect(token_ids=list(control.token_ids)).verdict != "watermarked"
    assert control.key_id is None


def test_same_seed_reproduces_and_no_seed_varies(models):
    a, b = _run(models, "mpfr", 2, 3, seed=11), _run(models, "mpfr", 2, 3, seed=11)
    assert a.token_ids == b.token_ids
    fresh = {_run(models, "mpfr", 2, 3, seed=None).token_ids for _ in range(3)}
    assert len(fresh) == 3  # 16 bits of unkeyed prefix: equal answers have probability <= 2^-16 each
    assert all(len(_run(models, "basic-uwm", seed=None).diverse_positions) > 0 for _ in range(2))


def test_generator_mask_equals_the_detector_mask_from_the_final_text():
    # A low-entropy Markov LM repeats itself, so many windows recur and get masked.
    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.full(12, 0.15), size=12)
    target, drafter = FakeLM.markov(table), FakeLM.markov(rng.dirichlet(np.full(12, 0.15), size=12))
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="2" * 64, vocab_size=12))
    key = KeyMaterial(key_id="k", secret=Secret(b"m" * 32), spec=spec)
    prompt = [1, 2, 3, 4, 5, 6]
    for method, drafts in (("basic-uwm", 1), ("pfr", 1), ("mpfr", 4)):
        for seed in range(5):
            config = SamplerConfig(method=method, drafts=drafts, max_new_tokens=120)
            out = generate(target, prompt, config=config, key=key, drafter=drafter, seed=seed)
            text = np.array(prompt + list(out.token_ids), dtype=np.uint32)
            with_prompt = scored_positions(text, 4, start=len(prompt))
            assert [t - len(prompt) for t in with_prompt.masked] == list(out.masked_positions)
            assert len(out.masked_positions) > 10
            # Answer only: the detector drops a subset of what the generator masked (never more),
            # positions < h are not scorable, and windows first seen in the prompt overlap are rare.
            answer = scored_positions(np.array(out.token_ids, dtype=np.uint32), 4, start=0)
            assert set(answer.masked.tolist()) <= set(out.masked_positions)


def test_int8_weights_are_cached_between_loads(tmp_path, tiny_qwen):
    cache = tmp_path / "int8.safetensors"
    first = HFModel(prepare_model(tiny_qwen(0), "int8", "cpu", int8_cache=cache), frozenset({EOS}))
    assert [f.name for f in tmp_path.iterdir()] == [cache.name]  # no partial file left behind
    stamp = cache.stat().st_mtime_ns
    second = HFModel(prepare_model(tiny_qwen(0), "int8", "cpu", int8_cache=cache), frozenset({EOS}))
    assert cache.stat().st_mtime_ns == stamp  # read, not rewritten
    a, _ = first.session(PROMPT).extend([], [])
    b, _ = second.session(PROMPT).extend([], [])
    assert torch.equal(a, b)


# Prefix-mode keys: the paper's labels (every token before a position, prompt included).
PREFIX_KEY = KeyMaterial(
    key_id="wk_prefix", secret=KEY.secret, spec=WatermarkSpec(tokenizer=SPEC.tokenizer, context_mode="prefix")
)
PREFIX_CONFIGS = [("pfr", 1, 2), ("pfr", 1, 4), ("mpfr", 2, 3), ("mpfr", 4, 4), ("mpfr", 8, 2)]


@pytest.mark.parametrize(
    "method,drafts,lookahead", PREFIX_CONFIGS, ids=[f"{m}-B{b}-L{ell}" for m, b, ell in PREFIX_CONFIGS]
)
def test_drafter_invariance_with_prefix_labels(models, method, drafts, lookahead):
    reference = _run(models, "basic-uwm", key=PREFIX_KEY)
    assert reference.masked_positions == ()  # a prefix label never repeats
    boundaries = set()
    for drafter in ("close", "unrelated"):
        for draft_t in (1.0, 0.5):
            out = _run(models, method, drafts, lookahead, drafter, draft_t, key=PREFIX_KEY)
            assert out.token_ids == reference.token_ids, (drafter, draft_t)
            assert out.masked_positions == () and out.diverse_positions == reference.diverse_positions
            assert out.target_forwards == len(out.blocks)
            boundaries.add(out.blocks)
    assert len(boundaries) > 1  # only block boundaries differ between drafters


@pytest.mark.parametrize("method,drafts", [("basic-uwm", 1), ("pfr", 1), ("mpfr", 4)])
def test_prefix_generation_is_detected_with_its_prompt(models, method, drafts):
    out = _run(models, method, drafts, max_new=160, key=PREFIX_KEY)
    ids = [*PROMPT, *out.token_ids]
    result = Detector([PREFIX_KEY]).detect(token_ids=ids, start=len(PROMPT))
    assert result.n_scored == len(out.token_ids)  # every generated position, diversity prefix included
    assert result.verdict == "watermarked" and result.p_value < 1e-4
    # The same secret in window mode labels positions differently: no evidence from this text.
    assert Detector([KEY]).detect(token_ids=ids, start=len(PROMPT)).verdict != "watermarked"


def test_generator_prefix_seeds_equal_the_detector_pivots(models):
    # The generator hashes each whole prefix; the detector hashes the text incrementally. They
    # must give the same uniform U(y_t, 1) at every keyed position.
    out = _run(models, "mpfr", 4, max_new=60, key=PREFIX_KEY)
    ids = [*PROMPT, *out.token_ids]
    policy = ClockPolicy(PREFIX_KEY, b"n" * 16, prompt_len=len(PROMPT))
    mine = [
        float(policy.uniforms(policy.seed(ids[:t], ClockKind.KEYED), np.array([ids[t]]))[0, 0])
        for t in range(len(PROMPT), len(ids))
    ]
    theirs = KeyedSource(PREFIX_KEY.secret, PREFIX_KEY.spec).prefix_pivots(ids, len(PROMPT))
    assert mine == theirs.tolist()
    assert {policy.kind(ids[:t]) for t in range(len(PROMPT), len(ids))} == {ClockKind.KEYED}
