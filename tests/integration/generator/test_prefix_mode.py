"""Prefix-mode keys (the paper's labels) end to end on tiny random transformers: every sampler
gives the same text whatever the drafter, every generated position is keyed, and the detector,
given the prompt's token IDs in front of the answer, finds the watermark."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.detector import Detector
from wmark.generator.clocks import ClockKind, ClockPolicy
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.hf_backend import HFModel
from wmark.generator.logits import LogitsConfig
from wmark.prf import KeyedSource

VOCAB = 256  # the tiny models of conftest.py
REF = TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=VOCAB)
SECRET = Secret(hashlib.sha256(b"tiny prefix key").digest())
KEY = KeyMaterial(key_id="wk_prefix", secret=SECRET, spec=WatermarkSpec(tokenizer=REF, context_mode="prefix"))
PROMPT = [17, 42, 99, 3, 250, 7, 7, 128, 64, 5]


@pytest.fixture(scope="module")
def models(tiny_trio) -> dict[str, HFModel]:
    return tiny_trio()


def _run(models, method, drafts=1, lookahead=4, drafter="close", draft_t=1.0, max_new=40, key=KEY):
    config = SamplerConfig(
        method=method,
        drafts=drafts,
        lookahead=lookahead,
        max_new_tokens=max_new,
        draft_logits=LogitsConfig(temperature=draft_t),
    )
    return generate(models["target"], PROMPT, config=config, key=key, drafter=models[drafter], seed=5)


CONFIGS = [("pfr", 1, 2), ("pfr", 1, 4), ("mpfr", 2, 3), ("mpfr", 4, 4), ("mpfr", 8, 2)]


@pytest.mark.parametrize(
    "method,drafts,lookahead", CONFIGS, ids=[f"{m}-B{b}-L{ell}" for m, b, ell in CONFIGS]
)
def test_drafter_invariance_with_prefix_labels(models, method, drafts, lookahead):
    reference = _run(models, "basic-uwm")
    assert reference.masked_positions == ()  # a prefix label never repeats
    boundaries = set()
    for drafter in ("close", "unrelated"):
        for draft_t in (1.0, 0.5):
            out = _run(models, method, drafts, lookahead, drafter, draft_t)
            assert out.token_ids == reference.token_ids, (drafter, draft_t)
            assert out.masked_positions == () and out.diverse_positions == reference.diverse_positions
            assert out.target_forwards == len(out.blocks)
            boundaries.add(out.blocks)
    assert len(boundaries) > 1  # only block boundaries differ between drafters


@pytest.mark.parametrize("method,drafts", [("basic-uwm", 1), ("pfr", 1), ("mpfr", 4)])
def test_prefix_generation_is_detected_with_its_prompt(models, method, drafts):
    out = _run(models, method, drafts, max_new=160)
    detector = Detector([KEY])
    ids = [*PROMPT, *out.token_ids]
    result = detector.detect(token_ids=ids, start=len(PROMPT))
    assert result.n_scored == len(out.token_ids)  # every generated position, diversity prefix included
    assert result.verdict == "watermarked" and result.p_value < 1e-4
    # The same secret in window mode labels positions differently: no evidence from this text.
    window_key = KeyMaterial(key_id="wk_window", secret=SECRET, spec=WatermarkSpec(tokenizer=REF))
    assert Detector([window_key]).detect(token_ids=ids, start=len(PROMPT)).verdict != "watermarked"


def test_generator_seeds_equal_the_detector_pivots(models):
    # The generator hashes each whole prefix; the detector hashes the text incrementally. They
    # must give the same uniform U(y_t, 1) at every keyed position.
    out = _run(models, "mpfr", 4, max_new=60)
    ids = [*PROMPT, *out.token_ids]
    policy = ClockPolicy(KEY, b"n" * 16, prompt_len=len(PROMPT))
    mine = [
        float(policy.uniforms(policy.seed(ids[:t], ClockKind.KEYED), np.array([ids[t]]))[0, 0])
        for t in range(len(PROMPT), len(ids))
    ]
    theirs = KeyedSource(KEY.secret, KEY.spec).prefix_pivots(ids, len(PROMPT))
    assert mine == theirs.tolist()
    assert {policy.kind(ids[:t]) for t in range(len(PROMPT), len(ids))} == {ClockKind.KEYED}
