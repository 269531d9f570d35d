"""Block-scaled int8 weights (`RowInt8Linear.scale_cols`): a scale per output channel and block
of input columns. The kernel's contract bit for bit (each block's exact sum scaled, the blocks
added in order, then the row's scale) with every activation mode, in every build and at any
thread and row count; one block is the per-channel layer's bits; the rounding it saves; stacking,
the packed cache and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import SCALE_COLS, RowInt8Linear, gemm_threads_for
from wmark.generator.drafters.int4_weights import RowInt4Linear
from wmark.generator.models import int8_store
from wmark.generator.models.fused import stack

BACKENDS = _int8_gemm.backends()
OUTLIERS = 16


def _layer(seed: int, cols: int, out: int = 70, inp: int = 200, bias: bool = True) -> RowInt8Linear:
    """Shapes off the kernel's grain: 70 channels (tiles of 32), 200 columns (blocks of `cols`,
    the last narrower where 200 is not a multiple)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inp, generator=gen)
    offset = torch.randn(out, generator=gen) if bias else None
    return RowInt8Linear(*RowInt8Linear.quantize(weight, cols), offset, cols)


def _heavy_rows(seed: int, count: int, width: int) -> torch.Tensor:
    """Mostly small values, 20 channels a row a hundred times larger (as in the outlier tests)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, width, generator=gen)
    where = torch.randint(0, width, (count, 20), generator=gen)
    return x.scatter_(1, where, 100.0 * torch.randn(count, 20, generator=gen))


def _blocks(layer: RowInt8Linear, q: torch.Tensor) -> torch.Tensor:
    """(rows, out) float32: each block's exact integer sum times the block's scale, the blocks
    added in ascending order (the first one is not added to anything)."""
    weight, scale = layer.int8_weight()
    total = None
    for b in range(layer.blocks):
        cols = slice(b * layer.scale_cols, min((b + 1) * layer.scale_cols, layer.in_features))
        part = (q[:, cols].double() @ weight[:, cols].double().T).float() * scale[:, b].float()
        total = part if total is None else total + part
    assert total is not None
    return total


def _quantised(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    peak = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    return torch.round(x * (127.0 / peak)), peak / 127.0


def _chosen(row: torch.Tensor) -> list[int]:
    """The row's 16 float channels: by magnitude, larger first, ties to the lower; ascending."""
    order = sorted(range(len(row)), key=lambda c: (-abs(float(row[c])), c))
    return sorted(order[:OUTLIERS])


def _reference(layer: RowInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The contract in torch for the layer's activation mode, every step in float32."""
    bias = 0.0 if layer.bias is None else layer.bias.detach()
    if layer.activations == "one":
        q, step = _quantised(x)
        return _blocks(layer, q) * step + bias
    if layer.activations == "two":
        q, step = _quantised(x)
        q2, step2 = _quantised(x - q * step)
        return _blocks(layer, q) * step + _blocks(layer, q2) * step2 + bias
    weight, scale = layer.int8_weight()
    rows = []
    for row in x:  # outliers: the rest's one part, the bias, then each block's float channels
        chosen = _chosen(row)
        rest = row.clone()
        rest[chosen] = 0.0
        q, step = _quantised(rest[None])
        out = _blocks(layer, q)[0] * step[0] + bias
        for b in sorted({c // layer.scale_cols for c in chosen}):
            side = torch.zeros(layer.out_features)
            for c in (c for c in chosen if c // layer.scale_cols == b):
                side = side + weight[:, c].float() * row[c]
            out = out + side * scale[:, b].float()
        rows.append(out)
    return torch.stack(rows)


@pytest.mark.parametrize("activations", ["one", "two", "outliers"])
@pytest.mark.parametrize("cols", [8, 36, 128])
def test_the_output_is_each_blocks_exact_sum_scaled_and_added_in_order(backend, activations, cols):
    for bias in (True, False):
        layer = _layer(1, cols, bias=bias)
        layer.activations = activations
        x = _heavy_rows(2, 17, 200)
        assert torch.equal(layer(x), _reference(layer, x)), (backend, activations, cols, bias)


def test_every_build_gives_the_same_bits_at_any_thread_and_row_count():
    layer = _layer(3, 64, out=300, inp=448)
    x = _heavy_rows(4, 40, 448)
    try:
        for activations in ("one", "two", "outliers"):
            layer.activations = activations
            expected = _reference(layer, x)
            for name in BACKENDS:
                _int8_gemm.use_backend(name)  # "amx" runs block scales on its VNNI code
                for rows in (1, 2, 3, 7, 13, 40):
                    for threads in (1, 2, 3):
                        with gemm_threads_for(threads):
                            got = layer(x[:rows])
                        assert torch.equal(got, expected[:rows]), (activations, name, rows, threads)
    finally:
        _int8_gemm.use_backend(BACKENDS[0])


@pytest.mark.parametrize("activations", ["one", "two", "outliers"])
def test_one_block_is_the_per_channel_layer_bit_for_bit(backend, activations):
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(70, 200, generator=gen)
    bias = torch.randn(70, generator=gen)
    plain = RowInt8Linear(*RowInt8Linear.quantize(weight), bias)
    one_block = RowInt8Linear(*RowInt8Linear.quantize(weight, 200), bias, 200)
    assert one_block.blocks == 1
    assert torch.equal(plain.int8_weight()[0], one_block.int8_weight()[0])
    plain.activations = one_block.activations = activations
    x = _heavy_rows(6, 9, 200)
    assert torch.equal(plain(x), one_block(x)), (backend, activations)


def test_block_scales_keep_blocks_of_small_weights():
    """A weight row whose columns differ in scale block by block (as smoothing leaves them):
    per channel, the small blocks get a handful of levels; per block, each its own 255."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(64, 512, generator=gen) * torch.logspace(0, -2, 4).repeat_interleave(128)
    plain = RowInt8Linear(*RowInt8Linear.quantize(weight), None)
    blocked = RowInt8Linear(*RowInt8Linear.quantize(weight, SCALE_COLS), None)
    assert blocked.scale_cols == SCALE_COLS and blocked.scale.shape == (64, 4)
    plain_err = (plain.dequantised() - weight.double()).norm()
    blocked_err = (blocked.dequantised() - weight.double()).norm()
    # Rounding error per weight is ~uniform over a step; the steps of the three smaller blocks
    # shrink 4.6x, 21x and 100x, so the total error (dominated by those blocks per channel)
    # falls by well over 1.6x (sqrt of the blocks' share); 1.5x holds for any seed.
    assert blocked_err * 1.5 < plain_err, (float(blocked_err), float(plain_err))
    # each weight within half a step of its block's scale
    steps = blocked.scale.repeat_interleave(SCALE_COLS, dim=1)
    assert bool(((blocked.dequantised() - weight.double()).abs() <= steps / 2 + 1e-12).all())


def test_stacked_and_cached_layers_keep_their_blocks(tmp_path):
    a, b = _layer(8, 36, out=40), _layer(9, 36, out=50)
    both = stack([a, b])
    assert both.scale_cols == 36 and both.scale.shape == (90, 6)
    x = _heavy_rows(10, 5, 200)
    assert torch.equal(both(x), torch.cat([a(x), b(x)], dim=1))
    with pytest.raises(ValueError, match="different scale blocks"):
        stack([a, _layer(11, 8)])
    # the packed cache: a layer rebuilt from its stored packed weights, sums and 2-D scales
    packed, colsum = both.packed_weights()
    path = tmp_path / "layer.safetensors"
    import safetensors.torch

    safetensors.torch.save_file({"packed": packed, "colsum": colsum, "scale": both.scale}, str(path))
    stored = safetensors.torch.load_file(str(path))
    again = RowInt8Linear.from_packed(
        stored["packed"], stored["colsum"], (90, 200), stored["scale"], both.bias.detach(), 36
    )
    assert torch.equal(again(x), both(x))
    assert int8_store.FORMAT.startswith("wmark-int8-packed/")


def test_bad_block_arguments_are_refused():
    layer = _layer(12, 36)
    packed, colsum = (t.numpy() for t in layer.packed_weights())
    scale = layer._scale32.numpy()  # noqa: SLF001 - the kernel's own layout
    x = np.ones((1, 200), dtype=np.float32)
    out = np.empty((1, 70), dtype=np.float32)
    with pytest.raises(ValueError, match="multiple of 4"):
        _int8_gemm.linear(x, packed, colsum, scale, None, out, 1, 70, 200, 1, 0, None, 0.0, 0, 6)
    with pytest.raises(ValueError, match="scale holds"):  # per-channel scales for a blocked call
        _int8_gemm.linear(x, packed, colsum, scale[0], None, out, 1, 70, 200, 1, 0, None, 0.0, 0, 36)
    with pytest.raises(ValueError, match="scale holds"):  # the scales of another block width
        _int8_gemm.linear(x, packed, colsum, scale, None, out, 1, 70, 200, 1, 0, None, 0.0, 0, 8)
    with pytest.raises(ValueError, match="8-bit weights"):
        _int8_gemm.linear4(x, packed, colsum, scale, None, out, 1, 70, 200, 1, 0, None, 0.0, 0, 36)
    with pytest.raises(ValueError, match="do not fit"):
        RowInt8Linear(layer.int8_weight()[0], layer.scale[:, :2], None, 36)
    with pytest.raises(ValueError, match="multiple of 4"):
        RowInt8Linear(*RowInt8Linear.quantize(torch.ones(4, 12), 6), None, 6)
    with pytest.raises(ValueError, match="scale per channel"):
        RowInt4Linear.from_int8(layer)
