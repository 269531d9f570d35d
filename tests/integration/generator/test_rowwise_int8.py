"""`RowInt8Linear`: a row's output does not depend on its batch or on which GEMM kernel ran."""

from __future__ import annotations

import pytest
import torch

from wmark.generator import rowwise
from wmark.generator.rowwise import AMX_MIN_ROWS, RowInt8Linear, activation_levels


def _layer(seed: int, out: int = 40, inp: int = 96) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    return weight, scale, torch.randn(out, generator=gen)


def test_rows_alone_equal_rows_in_any_batch():
    layer = RowInt8Linear(*_layer(0))
    gen = torch.Generator().manual_seed(1)
    # rows of very different magnitude: each is quantised with its own peak
    x = torch.randn(17, 96, generator=gen) * torch.logspace(-3, 3, 17)[:, None]
    alone = torch.cat([layer(x[i : i + 1]) for i in range(17)])
    for rows in (2, AMX_MIN_ROWS, 8, 17):  # below and above the kernel switch
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


def test_the_value_is_the_dequantised_product():
    weight, scale, bias = _layer(2)
    layer = RowInt8Linear(weight, scale, bias)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(3))
    peak = x.abs().amax(dim=1, keepdim=True)
    levels = activation_levels()
    q = torch.round(x * (levels / peak))
    expected = (q.double() @ weight.double().T) * scale * (peak.double() / levels) + bias.double()
    # float32 rounding of an exact integer sum, times two float32 scales: a few ulps of the output
    torch.testing.assert_close(layer(x).double(), expected, rtol=1e-6, atol=1e-5)


def test_the_largest_products_do_not_saturate():
    """All weights and activations at their extremes: fbgemm without VNNI adds pairs of products
    into a saturating int16, which 8-bit activations overflow (`activation_levels` then picks 7)."""
    weight = torch.full((16, 256), 127, dtype=torch.int8)
    weight[1::2] = -127
    layer = RowInt8Linear(weight, torch.ones(16, dtype=torch.float64), None)
    x = torch.ones(AMX_MIN_ROWS + 1, 256)
    x[1] = -1.0
    for rows in (1, 2, AMX_MIN_ROWS + 1):  # both kernels where there are two
        out = layer(x[:rows])
        expected = x[:rows, :1] * torch.tensor([256.0 * 127, -256.0 * 127] * 8)
        # exact integer sums, times the float32 scales peak / levels and levels / peak: ~1e-7 off
        # (a saturated sum is off by orders of magnitude: 8,160 for 1,032,256 in the probe's case)
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=0, msg=str(rows))


@pytest.mark.skipif(not rowwise.amx_available(), reason="this CPU has no AMX: one kernel only")
def test_amx_and_fbgemm_give_the_same_bits(monkeypatch):
    weight, scale, bias = _layer(4, out=300, inp=256)
    with_amx = RowInt8Linear(weight, scale, bias)
    monkeypatch.setattr(rowwise, "amx_available", lambda: False)
    without = RowInt8Linear(weight, scale, bias)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(5))
    assert torch.equal(with_amx(x), without(x))
    assert with_amx.int8_weight()[0].equal(weight)


def test_packing_waits_for_first_use():
    weight, scale, bias = _layer(6)
    layer = RowInt8Linear(weight, scale, bias)
    assert layer._packed is None and layer.int8_weight()[0] is weight  # stacking needs no unpack
    out = layer(torch.randn(2, 96, generator=torch.Generator().manual_seed(7)))
    assert out.shape == (2, 40) and layer._packed is not None
    assert layer.int8_weight()[0].equal(weight)  # the same weights back from the packing


def test_a_layer_packed_in_pieces_gives_the_bits_of_one_piece(monkeypatch):
    weight, scale, bias = _layer(8, out=50, inp=64)
    whole = RowInt8Linear(weight, scale, bias)
    whole.pack()
    assert whole._packed is not None and len(whole._packed) == 1
    monkeypatch.setattr(rowwise, "PACK_ROWS", 16)  # 50 output channels: pieces of 16, 16, 16 and 2
    pieces = RowInt8Linear(weight, scale, bias)
    pieces.pack()
    assert pieces._packed is not None and len(pieces._packed) == 4
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(9))
    assert torch.equal(pieces(x), whole(x))
    assert torch.equal(pieces.dynamic(x), whole.dynamic(x))
    assert pieces.int8_weight()[0].equal(weight)
