"""The engine's streaming hooks: `on_emit` sees every emitted token once, in order, block by block;
`should_stop` ends the generation between blocks (what a server does for a client that left)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM

P = np.array([0.34, 0.22, 0.16, 0.12, 0.09, 0.05, 0.02])
Q = np.array([0.10, 0.35, 0.05, 0.25, 0.05, 0.05, 0.15])
KEY = KeyMaterial(
    key_id="k",
    secret=Secret(hashlib.sha256(b"hooks").digest()),
    spec=WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=len(P))),
)


@pytest.mark.parametrize("method", ["basic-uwm", "mpfr"])
def test_on_emit_streams_exactly_the_generated_tokens(method):
    blocks: list[list[int]] = []
    config = SamplerConfig(method=method, max_new_tokens=40, lookahead=3)
    result = generate(
        FakeLM.fixed(P),
        [1, 2, 3],
        config=config,
        key=KEY,
        drafter=FakeLM.fixed(Q),
        seed=5,
        on_emit=lambda ids: blocks.append(list(ids)),
    )
    assert [len(b) for b in blocks] == list(result.blocks)
    assert [t for b in blocks for t in b] == list(result.token_ids)
    plain = generate(FakeLM.fixed(P), [1, 2, 3], config=config, key=KEY, drafter=FakeLM.fixed(Q), seed=5)
    assert plain.token_ids == result.token_ids  # watching changes nothing


@pytest.mark.parametrize("after_blocks", [0, 1, 4])
def test_should_stop_ends_generation_between_blocks(after_blocks):
    emitted: list[int] = []
    result = generate(
        FakeLM.fixed(P),
        [1, 2, 3],
        config=SamplerConfig(method="mpfr", max_new_tokens=200, lookahead=3),
        key=KEY,
        drafter=FakeLM.fixed(Q),
        seed=5,
        on_emit=lambda ids: emitted.append(len(ids)),
        should_stop=lambda: len(emitted) >= after_blocks,
    )
    assert result.stop_reason == "cancelled"
    assert len(result.blocks) == after_blocks  # not one block more than asked
    assert len(result.token_ids) == sum(emitted) < 200


def test_should_stop_before_the_start_skips_the_prefill():
    prefilled: list[str] = []

    class Prefilling(FakeLM):
        def session(self, prompt_ids):
            session = super().session(prompt_ids)
            session.prefill = lambda: prefilled.append("prefill")  # a PrefillSession now
            return session

    target, config = Prefilling.fixed(P), SamplerConfig(method="basic-uwm", max_new_tokens=5)
    kept = generate(target, [1, 2, 3], config=config, key=KEY, seed=5)
    assert prefilled == ["prefill"] and len(kept.token_ids) == 5
    gone = generate(target, [1, 2, 3], config=config, key=KEY, seed=5, should_stop=lambda: True)
    assert gone.stop_reason == "cancelled" and gone.token_ids == () and gone.timings.prefill == 0.0
    assert prefilled == ["prefill"]  # not run again for the client that had left
