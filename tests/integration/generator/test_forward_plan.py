"""The forward plan: one object decides a session's attention, decoder and threads; and the KV
cache reaches the model under the keyword the installed transformers takes (a pre-5.25 version
takes only `past_key_values` and silently runs with no cache when handed `cache=`)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
from transformers import Qwen2ForCausalLM

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import BackendError
from wmark.generator.cpu import rowwise
from wmark.generator.cpu.threads import ThreadPlan
from wmark.generator.drafters.build import build_drafter
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models.forward_plan import ForwardPlan, cache_keyword
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import ModelPair
from wmark.generator.models.prepare import prepare_model

EOS = frozenset({0})
PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17, 42, 99]
KEY = KeyMaterial(
    key_id="wk_plan",
    secret=Secret(hashlib.sha256(b"plan key").digest()),
    spec=WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=256)),
)


class _PastKeyValuesQwen(Qwen2ForCausalLM):
    """A Qwen2 whose forward has the signature of transformers before 5.25: the cache comes as
    `past_key_values`, and an unknown keyword (`cache=`) would vanish into **kwargs."""

    def forward(  # type: ignore[override]
        self, input_ids: Any = None, past_key_values: Any = None, **kwargs: Any
    ) -> Any:
        if "cache" in kwargs:
            raise AssertionError("a pre-5.25 forward was handed `cache=`: its cache would stay empty")
        return super().forward(input_ids=input_ids, cache=past_key_values, **kwargs)


def _as_old_transformers(model: Qwen2ForCausalLM) -> _PastKeyValuesQwen:
    model.__class__ = _PastKeyValuesQwen
    return model  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("precision", "rows_exact", "lean"),
    [("int8", True, True), ("exact-fp32", True, False), ("fp32", False, False)],
)
def test_a_targets_plan_follows_its_precision(tiny_qwen, precision, rows_exact, lean):
    plan = HFModel(prepare_model(tiny_qwen(3), precision, "cpu"), EOS).plan
    assert plan.rows_exact is rows_exact  # batch invariant where the model was prepared for it
    assert (plan.decoder is not None) is lean  # wmark's loop where it runs int8 layers
    assert plan.decoder is None or (plan.decoder.exact and plan.decoder.tuner is None)
    assert plan.cache_keyword == "cache"  # this suite's transformers (>= 5.25)


def test_a_drafters_plan_attends_with_sdpa_and_tunes_its_threads(tiny_qwen):
    target = HFModel(prepare_model(tiny_qwen(3), "int8", "cpu"), EOS, gemm_threads=2)
    own = HFModel(prepare_model(tiny_qwen(4), "int8", "cpu"), EOS, gemm_threads=2)
    build_drafter("embedded", target, own)
    assert own.plan.rows_exact is False and own.plan.gemm_threads == 2
    assert own.plan.decoder is not None and not own.plan.decoder.exact and own.plan.decoder.tuner is not None
    assert target.plan.rows_exact  # the target is untouched


def test_a_plan_runs_its_forwards_on_its_threads():
    plan = ForwardPlan(rows_exact=True, decoder=None, gemm_threads=3, cache_keyword="cache")
    with plan.running():
        assert rowwise.gemm_threads() == 3
    assert rowwise.gemm_threads() == torch.get_num_threads()  # nothing left behind


def test_replanning_threads_reaches_both_models(tiny_qwen):
    # The server replans the CPU threads per generation (`ModelPair.use_threads`): the GEMM's count
    # must reach the models' plans, the only place a forward reads it from.
    pair = ModelPair.__new__(ModelPair)  # the models alone: no tokenizer is needed here
    pair.target = HFModel(prepare_model(tiny_qwen(3), "int8", "cpu"), EOS, gemm_threads=1)
    pair.drafter = HFModel(prepare_model(tiny_qwen(4), "int8", "cpu"), EOS, gemm_threads=1)
    before = torch.get_num_threads()
    try:
        pair.use_threads(ThreadPlan(1, 2, "passive"))
    finally:
        torch.set_num_threads(before)
    assert pair.target.plan.gemm_threads == pair.drafter.plan.gemm_threads == 2


def test_the_cache_keyword_is_the_one_the_forward_takes(tiny_qwen):
    assert cache_keyword(tiny_qwen(3)) == "cache"
    assert cache_keyword(_as_old_transformers(tiny_qwen(3))) == "past_key_values"
    with pytest.raises(BackendError, match="neither"):
        cache_keyword(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("precision", ["fp32", "exact-fp32"])
def test_a_pre_5_25_forward_generates_the_same_text(tiny_qwen, precision):
    """transformers' forward with the cache under `past_key_values` (the path a stock 5.17 GPU
    image takes) gives every method the text and logits of the current keyword: the same
    weights, the same operations, only the keyword differs."""
    current = HFModel(prepare_model(tiny_qwen(3), precision, "cpu"), EOS)
    old = HFModel(prepare_model(_as_old_transformers(tiny_qwen(3)), precision, "cpu"), EOS)
    assert old.plan.cache_keyword == "past_key_values" and old.plan.decoder is None
    for method, drafts in (("basic-uwm", None), ("mpfr", 2)):
        config = SamplerConfig(method=method, drafts=drafts, lookahead=3, max_new_tokens=24)
        runs = [
            generate(model, PROMPT, config=config, key=KEY, drafter=model if drafts else None, seed=1)
            for model in (current, old)
        ]
        assert runs[0].token_ids == runs[1].token_ids, method
    a, b = current.session(PROMPT), old.session(PROMPT)
    assert torch.equal(a.extend([-1, 0], [5, 9])[1], b.extend([-1, 0], [5, 9])[1])
