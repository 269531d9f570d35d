"""4-bit drafter weights (`wmark.generator.drafters.int4_weights`): `linear4` computes the exact sums of the
4-bit values on every build, rows stay batch-invariant, and a drafter cut to 4 bits still drafts
and leaves the text basic-uwm's."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.drafters.int4_weights import RowInt4Linear, cut_to_int4
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.lean_decoder import lean_decoder
from wmark.generator.models.prepare import prepare_model


def _int8_layer(seed: int, out: int = 70, inp: int = 97) -> RowInt8Linear:
    """Shapes off the kernel's grain: 70 channels (tiles of 32), 97 columns (groups of 4)."""
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    return RowInt8Linear(weight, scale, torch.randn(out, generator=gen))


def _rows(seed: int, count: int, width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(count, width, generator=gen) * torch.logspace(-2, 2, count)[:, None]


def test_the_4_bit_weights_are_the_int8_weights_rounded_per_channel():
    layer = _int8_layer(0)
    w8, s8 = layer.int8_weight()
    cut = RowInt4Linear.from_int8(layer)
    w4, s4 = cut.int8_weight()
    assert int(w4.min()) >= -8 and int(w4.max()) <= 7
    step = w8.to(torch.float32).abs().amax(dim=1, keepdim=True) / 7.0
    assert torch.equal(w4, torch.round(w8.to(torch.float32) / step).clamp(-8, 7).to(torch.int8))
    assert torch.allclose(s4, s8 * step[:, 0].double())
    # each weight within half a 4-bit step of the int8 weight (in the layer's units)
    error = (w4.double() * s4[:, None] - w8.double() * s8[:, None]).abs()
    assert bool((error <= 0.5 * s4[:, None] + 1e-12).all())


def test_linear4_is_the_int8_kernel_on_the_4_bit_values(backend):
    """The same layer on `linear` (its 4-bit values as int8 weights) gives the same bits: exact
    integer sums, the same scaling."""
    cut = RowInt4Linear.from_int8(_int8_layer(1))
    weight, scale = cut.int8_weight()
    plain = RowInt8Linear(weight, scale, cut.bias.detach())
    x = _rows(2, 30, 97)
    assert torch.equal(cut(x), plain(x)), backend


def test_4_bit_rows_alone_equal_rows_in_any_batch(backend):
    cut = RowInt4Linear.from_int8(_int8_layer(3))
    x = _rows(4, 30, 97)
    alone = torch.cat([cut(x[i : i + 1]) for i in range(30)])
    for rows in (2, 5, 12, 13, 30):
        assert torch.equal(cut(x[:rows]), alone[:rows]), (backend, rows)


def test_4_bit_blocks_on_the_tile_unit_equal_rows_alone(backend):
    """Under the "amx" build, 16 rows or more over whole 64-column chunks widen each tile's
    nibbles to int8 and run on the tile unit (a prompt's prefill); the other builds run them as
    any block. Row blocks of 32 and 16, padding rows, channels past a tile's end, and (8,960
    columns) panels of 64 rows; 10,368 columns are wider than the widening buffer and stay on
    VNNI. Every case must give the one-row bits (one row never tiles)."""
    for inp, counts in ((128, (16, 17, 31, 32, 33, 48, 49)), (8960, (100,)), (10368, (20,))):
        cut = RowInt4Linear.from_int8(_int8_layer(7, out=70, inp=inp))
        x = _rows(8, max(counts), inp)
        alone = torch.cat([cut(x[i : i + 1]) for i in range(max(counts))])
        weight, scale = cut.int8_weight()
        assert torch.equal(alone, RowInt8Linear(weight, scale, cut.bias.detach())(x)), backend
        for rows in counts:
            assert torch.equal(cut(x[:rows]), alone[:rows]), (backend, inp, rows)


def test_a_copy_keeps_the_4_bit_layer():
    cut = RowInt4Linear.from_int8(_int8_layer(5))
    twin = copy.deepcopy(cut)
    x = _rows(6, 3, 97)
    assert isinstance(twin, RowInt4Linear) and torch.equal(twin(x), cut(x))
    with pytest.raises(ValueError, match="do not fit"):
        RowInt4Linear.from_packed(cut._packed[:-1], cut._colsum, (70, 97), cut.scale, None)
    packed8, _ = _int8_layer(5).packed_weights()
    short = torch.empty(packed8.numel() // 2 - 1, dtype=torch.uint8)
    sums, step = torch.empty(96, dtype=torch.int32), torch.empty(96)
    with pytest.raises(ValueError, match="packed4 holds"):
        _int8_gemm.pack4(packed8.numpy(), short.numpy(), sums.numpy(), step.numpy(), 70, 97)


SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=256))
KEY = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny key").digest()), spec=SPEC)
PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17, 42, 99, 3, 250, 9, 31, 17, 42]


def test_a_drafter_cut_to_4_bits_drafts_and_keeps_the_text(tiny_qwen):
    target = HFModel(prepare_model(tiny_qwen(2), "int8", "cpu"), frozenset({0}))
    drafter = copy.deepcopy(target)
    layers = len(int8_layers(drafter.model))
    assert cut_to_int4(drafter.model) == layers > 0  # every int8 layer, fused groups included
    assert all(isinstance(layer, RowInt4Linear) for layer in int8_layers(drafter.model))
    assert cut_to_int4(drafter.model) == 0  # already cut
    drafter.plan = dataclasses.replace(drafter.plan, rows_exact=False, decoder=lean_decoder(drafter.model))
    config = SamplerConfig(method="basic-uwm", max_new_tokens=40)
    reference = generate(target, PROMPT, config=config, key=KEY, seed=5)
    for method, drafts in (("pfr", 1), ("mpfr", 3)):
        config = SamplerConfig(method=method, drafts=drafts, lookahead=4, max_new_tokens=40)
        out = generate(target, PROMPT, config=config, key=KEY, drafter=drafter, seed=5)
        assert out.token_ids == reference.token_ids, method
        # the 4-bit drafter still agrees with the target often (the same weights, rounded):
        # at least one block in four emits more than one token
        assert sum(n > 1 for n in out.blocks) >= len(out.blocks) / 4, (method, out.blocks)
