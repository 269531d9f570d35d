"""Fused q/k/v and gate/up int8 projections give bit-identical logits (generator/models/fused.py), and an
int8 drafter on stock attention still leaves the text basic-uwm's."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import torch

import wmark.generator.models.prepare as prepare
from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.generator.cpu.rowwise import RowInt8Linear, convert_linears, pack_int8
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models.fused import FusedGroup, _Slice, fuse_projections, int8_layers, stack
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model

EOS = frozenset({0})
PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17, 42, 99]
TREE_PARENTS = [-1, -1, 0, 1, 2, 2, 4]  # two branches, one of them forking: rows see different keys
TREE_TOKENS = [5, 9, 77, 31, 8, 200, 1]


def _logits(model: HFModel) -> torch.Tensor:
    session = model.session(PROMPT)
    root, nodes = session.extend(TREE_PARENTS, TREE_TOKENS)
    return torch.cat([root[None], nodes])


def test_fused_projections_are_bit_identical(tiny_qwen, monkeypatch):
    base = tiny_qwen(3)
    fused = HFModel(prepare_model(copy.deepcopy(base), "int8", "cpu"), EOS)
    monkeypatch.setattr(prepare, "fuse_projections", lambda _model: 0)
    plain = HFModel(prepare_model(copy.deepcopy(base), "int8", "cpu"), EOS)
    layer = fused.model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, _Slice) and isinstance(layer.mlp.up_proj, _Slice)
    assert isinstance(plain.model.model.layers[0].self_attn.k_proj, RowInt8Linear)
    assert fused.plan.decoder is not None and plain.plan.decoder is None  # lean: fused groups only
    # both through transformers' decoder: only the fusing differs
    fused.plan = dataclasses.replace(fused.plan, decoder=None)
    # Exact equality, no tolerance: the fused GEMM must not change a single bit.
    assert torch.equal(_logits(fused), _logits(plain))
    assert fuse_projections(fused.model) == 0  # already fused: nothing left to fuse


def test_group_recomputes_for_a_new_input():
    gen = torch.Generator().manual_seed(0)
    layers = [
        RowInt8Linear(torch.randint(-127, 128, (n, 16), generator=gen, dtype=torch.int8), scale, None)
        for n, scale in (
            (8, torch.full((8,), 0.01, dtype=torch.float64)),
            (4, torch.rand(4, dtype=torch.float64)),
        )
    ]
    group = FusedGroup(stack(layers), 2)
    first, second = _Slice(group, 0, 8, 16), _Slice(group, 8, 12, 16)
    x, y = torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen)
    assert torch.equal(first(x), layers[0](x))
    assert torch.equal(second(y), layers[1](y))  # another input: not the cached result for x
    assert torch.equal(second(x), layers[1](x))


def test_int8_drafter_on_stock_attention_keeps_the_text(tiny_qwen, monkeypatch):
    base = tiny_qwen(3)
    target = HFModel(prepare_model(copy.deepcopy(base), "int8", "cpu"), EOS)
    # The drafter: the target's own weights with noise, so it drafts well but not perfectly.
    noisy = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.02 * param.std())
    drafter = HFModel(prepare_model(noisy, "int8", "cpu"), EOS)
    drafter.plan = dataclasses.replace(drafter.plan, rows_exact=False, decoder=None)  # stock SDPA
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=256))
    key = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny key").digest()), spec=spec)

    def run(method: str, draft: HFModel | None):
        config = SamplerConfig(method=method, max_new_tokens=40, lookahead=4)
        return generate(target, PROMPT, config=config, key=key, drafter=draft, seed=5)

    reference = run("basic-uwm", None)
    out = run("mpfr", drafter)
    assert out.token_ids == reference.token_ids
    assert out.aatps > 1.0  # drafts were accepted: the drafter really proposed
    calls: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    session = drafter.session(PROMPT)
    session.extend([], [])
    before = len(calls)
    session.extend(TREE_PARENTS, TREE_TOKENS)
    assert len(calls) > before  # its tree forwards really ran stock attention


def test_packing_on_threads_packs_every_layer_the_forward_runs(tiny_qwen):
    model = prepare_model(tiny_qwen(0), "exact-fp32", "cpu")  # float layers: nothing to pack
    assert int8_layers(model) == []
    model = tiny_qwen(0).to(torch.float32)
    convert_linears(model, "int8")
    fuse_projections(model)
    layers = int8_layers(model)
    assert not any(layer.packed for layer in layers)
    # per decoder layer: the q/k/v group, o, the gate/up group, down; and the output layer
    assert len(layers) == 4 * model.config.num_hidden_layers + 1
    pack_int8(layers, workers=2)
    assert all(layer.packed for layer in layers)
