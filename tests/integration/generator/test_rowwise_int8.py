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
    expected = x[:, :1] * torch.tensor([256.0 * 127, -256.0 * 127] * 8)
    for rows in (1, 2, AMX_MIN_ROWS + 1):  # both kernels where there are two
        # exact integer sums, times the float32 scales peak / levels and levels / peak: ~1e-7 off
        # (a saturated sum is off by orders of magnitude: 8,160 for 1,032,256 in the probe's case)
        torch.testing.assert_close(layer(x[:rows]), expected[:rows], rtol=1e-6, atol=0, msg=str(rows))
    if rowwise.onednn_available():  # the other kernel, used with AMX, at the same levels
        levels = activation_levels()
        sums = rowwise._onednn_sums(x * levels, levels + 1, layer.onednn_packing())
        assert torch.equal(sums, expected * levels)


@pytest.mark.skipif(not rowwise.onednn_available(), reason="torch without oneDNN: one kernel only")
def test_onednn_and_fbgemm_give_the_same_bits():
    """The two kernels a layer runs where the CPU has AMX agree on every CPU that has oneDNN."""
    weight, scale, bias = _layer(4, out=300, inp=256)
    layer = RowInt8Linear(weight, scale, bias)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(5))
    levels = activation_levels()
    q = torch.round(x * (levels / x.abs().amax(dim=1, keepdim=True)))
    for rows in (1, 2, AMX_MIN_ROWS, 9):
        by_fbgemm = rowwise._fbgemm_sums(q[:rows], levels + 1, layer.fbgemm_packing())
        assert torch.equal(by_fbgemm, rowwise._onednn_sums(q[:rows], levels + 1, layer.onednn_packing()))
        assert torch.equal(by_fbgemm, (q[:rows].double() @ weight.double().T).float()), rows


def test_a_missing_packing_is_built_from_the_other():
    """`pack` builds fbgemm's packing (and oneDNN's with AMX); either kernel's packing can be made
    later from the one the layer holds, without the weights, and gives the same numbers."""
    weight, scale, bias = _layer(10)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(11))
    layer = RowInt8Linear(weight, scale, bias)
    layer.pack()
    assert layer.packed and layer._fbgemm is not None
    assert (layer._onednn is not None) == rowwise.amx_available()
    if rowwise.onednn_available():
        only_onednn = RowInt8Linear(weight, scale, bias)
        only_onednn.onednn_packing()
        only_onednn._weight = None  # as if packed for oneDNN alone
        assert only_onednn.int8_weight()[0].equal(weight)
        assert torch.equal(only_onednn.dynamic(x), layer.dynamic(x))  # fbgemm's built from oneDNN's
        assert torch.equal(only_onednn(x), layer(x))


def test_packing_waits_for_first_use():
    weight, scale, bias = _layer(6)
    layer = RowInt8Linear(weight, scale, bias)
    assert not layer.packed and layer.int8_weight()[0] is weight  # stacking needs no unpack
    out = layer(torch.randn(2, 96, generator=torch.Generator().manual_seed(7)))
    assert out.shape == (2, 40) and layer.packed
    assert layer.int8_weight()[0].equal(weight)  # the same weights back from the packing


def test_a_layer_packed_in_pieces_gives_the_bits_of_one_piece(monkeypatch):
    weight, scale, bias = _layer(8, out=50, inp=64)
    whole = RowInt8Linear(weight, scale, bias)
    assert len(whole.fbgemm_packing()) == 1
    monkeypatch.setattr(rowwise, "PACK_ROWS", 16)  # 50 output channels: pieces of 16, 16, 16 and 2
    pieces = RowInt8Linear(weight, scale, bias)
    assert len(pieces.fbgemm_packing()) == 4
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(9))  # 2 rows: fbgemm's, AMX or not
    assert torch.equal(pieces(x), whole(x))
    assert torch.equal(pieces.dynamic(x), whole.dynamic(x))
    assert pieces.int8_weight()[0].equal(weight)
