"""The packed int8 cache (generator/models/int8_store.py): written once from plain int8 weights, then
mapped as it is by every later load, with the same logits bit for bit."""

from __future__ import annotations

import copy

import pytest
import safetensors.torch
import torch

from wmark.errors import BackendError
from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.models import int8_store
from wmark.generator.models.fused import _Slice
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model

PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    session = HFModel(model, frozenset({0})).session(PROMPT)
    root, _ = session.extend([], [])
    _, tree = session.extend([-1, -1, 0], [11, 12, 13])
    return torch.cat([root[None], tree])


def _plain_file(model: torch.nn.Module, path) -> None:
    """Plain int8 weights (`<name>.q`, `<name>.scale`), as the GGUF conversion writes them."""
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            tensors[f"{name}.q"], tensors[f"{name}.scale"] = RowInt8Linear.quantize(module.weight)
    safetensors.torch.save_file(tensors, path)


def test_a_plain_file_is_packed_once_then_mapped_as_it_is(tmp_path, tiny_qwen, monkeypatch):
    base = tiny_qwen(5)
    cache = tmp_path / "int8.safetensors"
    _plain_file(base, cache)
    assert not int8_store.is_packed(cache)
    reference = _logits(prepare_model(copy.deepcopy(base), "int8", "cpu"))  # no cache at all

    first = prepare_model(copy.deepcopy(base), "int8", "cpu", int8_cache=cache)
    assert int8_store.is_packed(cache) and [p.name for p in tmp_path.iterdir()] == [cache.name]
    assert torch.equal(_logits(first), reference)
    stored = safetensors.torch.load_file(cache)
    assert not any(name.endswith(".q") for name in stored)  # the weights are held once, packed
    assert "model.layers.0.self_attn.q_proj+k_proj+v_proj.packed" in stored

    def no_packing(*_args):
        raise AssertionError("a packed cache must not be packed again")

    monkeypatch.setattr(_int8_gemm, "pack", no_packing)
    stamp = cache.stat().st_mtime_ns
    second = prepare_model(copy.deepcopy(base), "int8", "cpu", int8_cache=cache)
    assert cache.stat().st_mtime_ns == stamp  # read, not rewritten
    assert isinstance(second.model.layers[0].mlp.up_proj, _Slice)  # fused groups come back fused
    assert torch.equal(_logits(second), reference)


def test_a_packed_file_that_does_not_fit_is_refused(tmp_path, tiny_qwen):
    cache = tmp_path / "int8.safetensors"
    prepare_model(tiny_qwen(0), "int8", "cpu", int8_cache=cache)
    tensors = safetensors.torch.load_file(cache)
    lacking = {k: v for k, v in tensors.items() if not k.startswith("lm_head.")}
    safetensors.torch.save_file(lacking, cache, metadata={"format": int8_store.FORMAT})
    with pytest.raises(BackendError, match="lacks lm_head: delete it"):
        prepare_model(tiny_qwen(0), "int8", "cpu", int8_cache=cache)
    cut = dict(tensors, **{"lm_head.packed": tensors["lm_head.packed"][:-128]})
    safetensors.torch.save_file(cut, cache, metadata={"format": int8_store.FORMAT})
    with pytest.raises(BackendError, match="does not fit the model at lm_head"):
        prepare_model(tiny_qwen(0), "int8", "cpu", int8_cache=cache)


def test_only_this_format_is_read_as_packed(tmp_path):
    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file(
        {"x.packed": torch.zeros(4, dtype=torch.uint8)}, other, metadata={"format": "v0"}
    )
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    assert not int8_store.is_packed(other)
    assert not int8_store.is_packed(garbage)
    assert not int8_store.is_packed(tmp_path / "absent.safetensors")
