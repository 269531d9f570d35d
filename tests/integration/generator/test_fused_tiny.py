"""Fused q/k/v and gate/up int8 projections give bit-identical logits (generator/fused.py), and a
drafter on stock attention still leaves the text basic-uwm's."""

from __future__ import annotations

import copy

import torch

import wmark.generator.hf_backend as hf_backend
from wmark.generator.fused import FusedGroup, _Slice, fuse_projections
from wmark.generator.hf_backend import HFModel, prepare_model
from wmark.generator.rowwise import RowInt8Linear

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
    monkeypatch.setattr(hf_backend, "fuse_projections", lambda _model: 0)
    plain = HFModel(prepare_model(copy.deepcopy(base), "int8", "cpu"), EOS)
    layer = fused.model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, _Slice) and isinstance(layer.mlp.up_proj, _Slice)
    assert isinstance(plain.model.model.layers[0].self_attn.k_proj, RowInt8Linear)
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
    group = FusedGroup(layers)
    first, second = _Slice(group, 0, 8, 16), _Slice(group, 8, 12, 16)
    x, y = torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen)
    assert torch.equal(first(x), layers[0](x))
    assert torch.equal(second(y), layers[1](y))  # another input: not the cached result for x
    assert torch.equal(second(x), layers[1](x))
