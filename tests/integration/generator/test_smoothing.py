"""Activation smoothing before int8 quantisation (`wmark.generator.models.smoothing`).

A tiny Qwen2 with two residual channels made 60x larger than the rest (the "massive activations"
of real Qwen2.5 models): smoothing leaves the float model's outputs as they were, brings the int8
model far closer to the float one, and survives the int8 cache (a second load is bit-identical).
"""

from __future__ import annotations

import copy

import torch

from wmark.generator.models import int8_store
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model
from wmark.generator.models.smoothing import ALPHA, ALPHA_OUTPUT, Smoothing, calibration_ids, measure

OUTLIERS = [3, 17]


def _with_outliers(tiny_qwen) -> torch.nn.Module:
    model = tiny_qwen(5)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, OUTLIERS] *= 60.0
    return model


def _ids(seed: int, n: int = 4, length: int = 48) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (length,), generator=gen).tolist() for _ in range(n)]


def _log_probs(model: torch.nn.Module, batches: list[list[int]]) -> torch.Tensor:
    """Next-token log-probabilities after every prefix of each sequence, through a decoding session
    (the forward generation runs: the int8 kernels need the session's masks): the first token as
    the prompt, the rest as one chain of draft nodes."""
    rows = []
    for ids in batches:
        session = HFModel(model, frozenset({0})).session(ids[:1])
        root, chain = session.extend(list(range(-1, len(ids) - 2)), ids[1:])
        rows.append(torch.cat([root[None], chain]))
    return torch.log_softmax(torch.cat(rows).to(torch.float64), -1)


def _kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    return float((reference.exp() * (reference - other)).sum(-1).mean())


def test_smoothing_is_exact_in_float(tiny_qwen):
    model = prepare_model(_with_outliers(tiny_qwen), "fp32", "cpu")
    before = _log_probs(model, _ids(1))
    plan = Smoothing.plan(measure(model, _ids(0)), model.config)
    assert plan is not None
    plan.apply(model)
    after = _log_probs(model, _ids(1))
    # the same function up to float32 rounding of the folded weights (~1e-6 relative per product,
    # summed over 2 layers): 1e-4 nats is ~100x what rounding gives, far below any int8 effect
    assert torch.allclose(before, after, atol=1e-4)
    factors = plan.columns["model.layers.0.self_attn.q_proj"]
    # the outlier channels moved into the weights: theirs are the largest factors
    assert sorted(factors.topk(len(OUTLIERS)).indices.tolist()) == OUTLIERS


def test_each_kind_of_layer_gets_its_strength(tiny_qwen):
    """The attention output projection's factors use ALPHA_OUTPUT, the other layers ALPHA: each
    factor is peak_x^a / peak_w^(1 - a) of its own peaks (the output projection's taken per
    value channel, the query heads sharing it giving the largest)."""
    model = prepare_model(_with_outliers(tiny_qwen), "fp32", "cpu")
    peaks = measure(model, _ids(0))
    plan = Smoothing.plan(peaks, model.config)
    assert plan is not None and ALPHA != ALPHA_OUTPUT
    layer = "model.layers.0"

    def factor(act: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
        return act.clamp_min(1e-5).pow(alpha) / weight.clamp_min(1e-5).pow(1 - alpha)

    down = f"{layer}.mlp.down_proj"
    assert torch.equal(plan.columns[down], factor(peaks.act[down], peaks.weight[down], ALPHA))
    config, o = model.config, f"{layer}.self_attn.o_proj"
    kv, heads = config.num_key_value_heads, config.num_attention_heads
    head_dim = config.hidden_size // heads

    def per_value(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(kv, heads // kv, head_dim).amax(dim=1).reshape(-1)

    expected = factor(per_value(peaks.act[o]), per_value(peaks.weight[o]), ALPHA_OUTPUT)
    assert torch.equal(plan.rows[f"{layer}.self_attn.v_proj"], expected)


def test_smoothing_brings_int8_close_to_float(tiny_qwen):
    base = _with_outliers(tiny_qwen)
    calibration, held_out = _ids(0), _ids(1)
    reference = _log_probs(prepare_model(copy.deepcopy(base), "fp32", "cpu"), held_out)

    def kl(smoothed: bool, residual: bool) -> float:
        model = prepare_model(
            copy.deepcopy(base),
            "int8",
            "cpu",
            calibration=calibration if smoothed else None,
            activations="two" if residual else "one",
        )
        return _kl(reference, _log_probs(model, held_out))

    plain, target = kl(False, False), kl(True, True)
    # measured (seeds fixed; every kernel build gives the same bits): a target's int8 (smoothed,
    # two activation parts) 18x closer than plain int8, and smoothing 2.25x closer with two
    # parts, 2.4x with one. The factors asserted (8, 1.5) leave room for other platforms' float
    # rounding while failing if either step were lost or only partly applied.
    assert target * 8 < plain, (plain, target)
    assert kl(True, True) * 1.5 < kl(False, True)
    assert kl(True, False) * 1.5 < plain


def test_outlier_rows_come_as_close_to_float_as_two_parts(tiny_qwen):
    base = _with_outliers(tiny_qwen)
    calibration, held_out = _ids(0), _ids(1)
    reference = _log_probs(prepare_model(copy.deepcopy(base), "fp32", "cpu"), held_out)

    def kl(rows: str) -> float:
        model = prepare_model(copy.deepcopy(base), "int8", "cpu", calibration=calibration, activations=rows)
        return _kl(reference, _log_probs(model, held_out))

    one, outliers, two = kl("one"), kl("outliers"), kl("two")
    # measured (seeds fixed, every build the same bits): one part 5.5e-5, the 16 largest
    # channels in float 7.7e-6, two parts 7.5e-6. The factors asserted (4, 1.5) fail if the
    # float channels were lost or only partly applied, with room for other platforms' rounding.
    assert outliers * 4 < one, (one, outliers)
    assert outliers < 1.5 * two, (outliers, two)


def test_a_smoothed_int8_cache_loads_as_it_was_built(tiny_qwen, tmp_path):
    base = _with_outliers(tiny_qwen)
    cache = tmp_path / "int8.safetensors"
    first = prepare_model(copy.deepcopy(base), "int8", "cpu", int8_cache=cache, calibration=_ids(0))
    assert int8_store.is_packed(cache)
    # the second load starts from the unsmoothed float checkpoint and gets no calibration:
    # the cache's divisors must redo the float side of the smoothing
    second = prepare_model(copy.deepcopy(base), "int8", "cpu", int8_cache=cache)
    assert torch.equal(_log_probs(first, _ids(1)), _log_probs(second, _ids(1)))


def test_calibration_text_goes_through_the_chat_template(tmp_path, word_model_dir):
    from transformers import PreTrainedTokenizerFast

    path = word_model_dir(tmp_path / "m", 0)
    # the tokenizer.json as it is (AutoTokenizer would rebuild a Qwen2 BPE from the model type)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    plain = calibration_ids(tokenizer)  # no template: the contents, every English word [UNK]
    assert len(plain) == 8 and all(plain) and {i for ids in plain for i in ids} == {0}
    tokenizer.chat_template = "{% for m in messages %}w7 {{ m['content'] }} {% endfor %}"
    templated = calibration_ids(tokenizer)
    assert all(ids.count(tokenizer.convert_tokens_to_ids("w7")) >= 2 for ids in templated)
