"""The baselines on tiny random transformers (built here, batch-invariant float32).

`mws` and `pfr` agree at every keyed position (docs/algorithms.md §6.3): both emit the target's keyed race
winner there. Every baseline runs one target forward per block, shares the detector's mask,
and the watermarked ones are detected while the unwatermarked ones are not. `gls` text depends on
the drafter (draft-indexed randomness), `mpfr` text does not.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.contexts import scored_positions
from wmark.detector import Detector
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.logits import LogitsConfig, Support, supports
from wmark.generator.models.hf_session import HFModel
from wmark.prf import KeyedSource, seed_uniforms
from wmark.race import race_winner

VOCAB = 256  # the tiny models of conftest.py
EOS = 0
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=VOCAB))
KEY = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny baselines").digest()), spec=SPEC)
PROMPT = [17, 42, 99, 3, 250, 7, 7, 128, 64, 5]


@pytest.fixture(scope="module")
def models(tiny_trio) -> dict[str, HFModel]:
    return tiny_trio()


def _run(
    models, method, *, drafts=None, lookahead=4, drafter="close", seed=5, max_new=40, bits=0.0, draft_t=1.0
):
    config = SamplerConfig(
        method=method,
        drafts=drafts,
        lookahead=lookahead,
        max_new_tokens=max_new,
        diversity_bits=bits,
        draft_logits=LogitsConfig(temperature=draft_t),
    )
    return generate(models["target"], PROMPT, config=config, key=KEY, drafter=models[drafter], seed=seed)


def _target_dists(model: HFModel, output: tuple[int, ...]) -> list[Support]:
    """P at every generated position, from one target forward over the whole output."""
    session = model.session(PROMPT)
    root, nodes = session.extend(list(range(-1, len(output) - 1)), list(output))
    return supports(torch.cat([root[None], nodes[:-1]]), LogitsConfig())


@pytest.fixture(scope="module")
def sharp(tiny_trio) -> dict[str, HFModel]:
    """A low-entropy pair: its texts repeat windows, so masked positions occur within 60 tokens."""
    return tiny_trio(sharpen=26.0)


@pytest.mark.parametrize("drafter", ["close", "unrelated"])
@pytest.mark.parametrize("lookahead", [1, 3])
def test_mws_and_pfr_agree_on_keyed_positions(sharp, drafter, lookahead):
    masked_seen = 0
    for i in range(3):
        key = KeyMaterial(key_id="k", secret=Secret(hashlib.sha256(b"agree%d" % i).digest()), spec=SPEC)
        source = KeyedSource(key.secret, SPEC)
        runs = {
            m: generate(
                sharp["target"],
                PROMPT,
                config=SamplerConfig(method=m, lookahead=lookahead, max_new_tokens=60, diversity_bits=0),
                key=key,
                drafter=sharp[drafter],
                seed=i,
            )
            for m in ("pfr", "mws")
        }
        pfr, mws = runs["pfr"], runs["mws"]
        # Same text up to the first repeated window (where each falls back to its own unkeyed rule).
        first_masked = min([*pfr.masked_positions, *mws.masked_positions, len(pfr.token_ids)])
        assert mws.token_ids[:first_masked] == pfr.token_ids[:first_masked]
        masked_seen += len(mws.masked_positions)
        # And position by position over the whole text, whatever happened before: at every keyed
        # position mws emitted the target's keyed race winner, which is pfr's rule.
        text = [*PROMPT, *mws.token_ids]
        for t, p in enumerate(_target_dists(sharp["target"], mws.token_ids)):
            if t in mws.masked_positions:
                continue
            window = tuple(text[len(PROMPT) + t - 4 : len(PROMPT) + t])
            winner = p.ids[race_winner(p.probs, seed_uniforms(source.seed(window), p.ids))]
            assert mws.token_ids[t] == winner, (i, t)
    assert masked_seen > 0  # the texts diverged somewhere, and keyed positions after it were checked


BASELINES = [("vsps", 1), ("mws", 1), ("mse", 1), ("mse-pseudo", 1), ("gls", 4)]


@pytest.mark.parametrize("method,drafts", BASELINES, ids=[m for m, _ in BASELINES])
def test_baseline_blocks_masks_and_detection(models, method, drafts):
    out = _run(models, method, drafts=drafts, drafter="unrelated", max_new=160, bits=16.0)
    assert out.target_forwards == len(out.blocks) and sum(out.blocks) == len(out.token_ids)
    assert out.draft_forwards <= 4 * len(out.blocks)  # one (batched) drafter forward per depth
    assert max(out.blocks) > 1  # the drafter's tokens were accepted sometimes
    detection = Detector([KEY]).detect(token_ids=list(out.token_ids))
    if method in ("vsps", "gls"):
        assert out.key_id is None and out.masked_positions == ()
        assert detection.verdict != "watermarked"
        return
    text = np.array(PROMPT + list(out.token_ids), dtype=np.uint32)
    masked = [t - len(PROMPT) for t in scored_positions(text, 4, start=len(PROMPT)).masked]
    assert masked == list(out.masked_positions)
    assert out.key_id == KEY.key_id and detection.verdict == "watermarked", detection.p_value


def test_gls_text_depends_on_the_drafter_and_mpfr_text_does_not(models):
    mpfr = {
        (d, t): _run(models, "mpfr", drafts=4, drafter=d, draft_t=t).token_ids
        for d in ("close", "unrelated")
        for t in (1.0, 0.5)
    }
    gls = {
        (d, t): _run(models, "gls", drafts=4, drafter=d, draft_t=t).token_ids
        for d in ("close", "unrelated")
        for t in (1.0, 0.5)
    }
    assert len(set(mpfr.values())) == 1
    assert len(set(gls.values())) > 1
