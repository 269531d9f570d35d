"""The serving-side race (what wmark's vLLM logits processor runs), driven as vLLM drives it.

A simulated serving loop feeds each request's logits row, lets the forced row decide the token
(the only finite logit), and appends it to the request's output list, moving and swapping rows
as vLLM's persistent batch does. The tokens must equal wmark's `basic-uwm` on the same logits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wmark.detector import Detector
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM
from wmark.generator.logits import LogitsConfig
from wmark.integrations.race_batch import RaceBatch, RequestRace

VOCAB = 501  # the word tokenizer's


def _logits(context: tuple[int, ...]) -> np.ndarray:
    """Peaked pseudo-random logits, a pure function of the context (Python hashes ints stably)."""
    rng = np.random.default_rng(hash(context) % 2**32)
    out = rng.normal(0.0, 3.0, VOCAB)
    out[0] = -math.inf  # a token no distribution uses
    return out


def _basic_uwm(key, prompt, n, logits, seed, bits):
    config = SamplerConfig(method="basic-uwm", max_new_tokens=n, target_logits=logits, diversity_bits=bits)
    return list(generate(FakeLM(VOCAB, _logits), prompt, config=config, key=key, seed=seed).token_ids)


def _serve(batch: RaceBatch, requests: dict[int, tuple[list[int], list[int]]], steps: int, shuffle=None):
    """Run `steps` decoding steps over the batch rows; `shuffle(step)` may move rows first."""
    for step in range(steps):
        if shuffle is not None:
            shuffle(step, requests)
        rows = sorted(requests)
        logits = torch.stack(
            [torch.tensor(_logits(tuple(requests[r][0] + requests[r][1])), dtype=torch.float32) for r in rows]
        )
        full = torch.full((max(rows) + 1, VOCAB), -1.0)
        full[rows] = logits
        forced = batch.apply(full)
        for r in rows:
            finite = torch.isfinite(forced[r]).nonzero().flatten().tolist()
            assert len(finite) == 1  # every other token is -inf: vLLM's sampler can only emit it
            requests[r][1].append(finite[0])


@pytest.mark.parametrize(
    "logits,bits",
    [
        (LogitsConfig(temperature=1.0, top_k=50), 16.0),
        (LogitsConfig(temperature=0.7, top_k=0, top_p=0.9), 0.0),
    ],
)
def test_served_tokens_equal_basic_uwm_and_are_detected(word_key, logits, bits):
    prompts = {0: [5, 6, 7], 1: [9, 9, 9, 9, 9], 2: [100]}
    seeds = {0: 11, 1: 12, 2: None}
    batch = RaceBatch()
    requests = {i: (p, []) for i, p in prompts.items()}
    for i, (prompt, outputs) in requests.items():
        batch.add(i, RequestRace.start(word_key, prompt, outputs, logits, seed=seeds[i], diversity_bits=bits))

    def shuffle(step, reqs):  # vLLM's persistent batch: a swap at step 5, a one-way move at step 9
        if step == 5:
            batch.move(0, 2, swap=True)
            reqs[0], reqs[2] = reqs[2], reqs[0]
        if step == 9:
            batch.move(1, 3, swap=False)
            reqs[3] = reqs.pop(1)

    _serve(batch, requests, 120, shuffle)
    by_prompt = {tuple(p): out for p, out in requests.values()}
    for i in (0, 1):  # seeded requests are reproducible: equal to basic-uwm token for token
        assert by_prompt[tuple(prompts[i])] == _basic_uwm(word_key, prompts[i], 120, logits, seeds[i], bits)
    detector = Detector([word_key])
    for _prompt, out in requests.values():
        assert detector.detect(token_ids=out).p_value < 1e-6


def test_rows_without_a_race_and_removed_rows_are_left_alone(word_key):
    batch = RaceBatch()
    batch.add(0, RequestRace.start(word_key, [1, 2], [], LogitsConfig(), seed=1, diversity_bits=0.0))
    batch.add(1, None)  # an allowed opt-out or a greedy request
    logits = torch.randn(2, VOCAB)
    before = logits[1].clone()
    batch.apply(logits)
    assert torch.equal(logits[1], before) and torch.isfinite(logits[0]).sum() == 1
    batch.remove(0)
    fresh = torch.randn(2, VOCAB)
    assert torch.equal(batch.apply(fresh.clone()), fresh)


def test_a_resumed_request_keeps_the_repeated_window_mask(word_key):
    """A request re-added with output already generated (vLLM preemption) replays its windows,
    so a window repeated after the resume is still unkeyed, as the detector expects."""
    logits = LogitsConfig(temperature=1.0, top_k=50)
    prompt, outputs = [3, 4, 5], []
    first = RaceBatch()
    first.add(0, RequestRace.start(word_key, prompt, outputs, logits, seed=4, diversity_bits=0.0))
    _serve(first, {0: (prompt, outputs)}, 60)
    resumed = RaceBatch()
    race = RequestRace.start(word_key, prompt, outputs, logits, seed=4, diversity_bits=0.0)
    resumed.add(0, race)
    _serve(resumed, {0: (prompt, outputs)}, 60)
    assert outputs == _basic_uwm(word_key, prompt, 120, logits, 4, 0.0)
