"""The draft model's fused kernel steps (RMSNorm and SwiGLU inside the GEMM call, the q/k/v split
with the rotary embedding) compute exactly what their float32 formulas say, step for step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmark.generator.cpu import _int8_gemm, _tree_attention
from wmark.generator.cpu.rowwise import RowInt8Linear, gemm_threads_for
from wmark.generator.drafters.int4_weights import RowInt4Linear

F = np.float32
BACKENDS = _int8_gemm.backends()  # this CPU's builds; "portable" runs everywhere


@pytest.fixture(params=BACKENDS)
def backend(request):
    _int8_gemm.use_backend(request.param)
    with gemm_threads_for(3):  # calls of many rows run their prologue on the pool's threads
        yield request.param
    _int8_gemm.use_backend(BACKENDS[0])


def _layer(seed: int, out: int, inp: int) -> RowInt8Linear:
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    return RowInt8Linear(weight, scale, torch.randn(out, generator=gen))


def _rms_rows(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The kernel's RMSNorm in float32, step for step: squares summed over 8 lanes (lane l takes
    columns l mod 8, in order), the lanes in order, x * (1 / sqrt(mean + eps)), times weight."""
    out = np.empty_like(x)
    k = x.shape[1]
    for r, row in enumerate(x):
        lanes = [F(0)] * 8
        for j, value in enumerate(row):
            lanes[j % 8] = F(lanes[j % 8] + F(value * value))
        squares = F(0)
        for lane in lanes:
            squares = F(squares + lane)
        inv = F(F(1) / F(np.sqrt(F(F(squares / F(k)) + F(eps)))))
        out[r] = (row * inv).astype(F) * weight
    return out


def _exp_nonpositive(x: np.ndarray) -> np.ndarray:
    """The kernels' e^x for x <= 0 (Cephes' polynomial), in float32 array arithmetic."""
    rounder = F(12582912.0)
    low = np.maximum(x, F(-87.0))
    n = (low * F(1.44269504088896341) + rounder) - rounder
    r = low - n * F(0.693359375)
    r = r - n * F(-2.12194440e-4)
    p = np.full_like(x, F(1.9875691500e-4))
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + F(c)
    p = p * r * r + r + F(1.0)
    scale = ((n.astype(np.int32) + 127) << 23).view(F)
    return np.where(x < F(-87.0), F(0), p * scale)


def _swiglu_rows(gate_up: np.ndarray) -> np.ndarray:
    k = gate_up.shape[1] // 2
    g, up = gate_up[:, :k], gate_up[:, k:]
    e = _exp_nonpositive(np.where(g < 0, g, -g))
    sigmoid = np.where(g < 0, e, F(1)) / (F(1) + e)
    return (g * sigmoid) * up


def _rows(seed: int, m: int, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, m)[:, None]


@pytest.mark.parametrize("four_bit", [False, True])
def test_the_rms_prologue_is_the_layer_of_the_normed_rows(backend, four_bit):
    """Every build (the vector ones compute 8 lanes at a time) gives the portable steps' bits."""
    layer = _layer(0, 70, 97)  # off the kernel's grain: 70 channels, 97 columns
    if four_bit:  # the drafter's 4-bit layers (portable C where the build is not VNNI: small here)
        layer = RowInt4Linear.from_int8(layer)
    x = _rows(1, 200, 97)  # 19,400 elements: rows split over the pool (9 rows: the caller alone)
    weight = torch.randn(97, generator=torch.Generator().manual_seed(2))
    normed = torch.from_numpy(_rms_rows(x.numpy(), weight.numpy(), 1e-6))
    assert torch.equal(layer.rms_forward(x, weight, 1e-6), layer(normed))
    assert torch.equal(layer.rms_forward(x[:9], weight, 1e-6), layer(normed[:9]))
    # and it is a real RMSNorm: within float32 rounding of torch's (the layer then re-quantises)
    expected = torch.nn.functional.rms_norm(x, (97,), weight, 1e-6)
    assert torch.allclose(normed, expected, rtol=1e-5, atol=1e-6)


def test_the_swiglu_prologue_is_the_layer_of_silu_gate_times_up(backend):
    layer = _layer(3, 40, 130)  # 130 columns: 16 vectors of 8 and a scalar tail of 2
    gate_up = _rows(4, 140, 260) * 3  # 18,200 gate elements: the rows split over the pool
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # saturated and zero gates
    rows = torch.from_numpy(_swiglu_rows(gate_up.numpy()))
    assert torch.equal(layer.swiglu_forward(gate_up), layer(rows))
    assert torch.equal(layer.swiglu_forward(gate_up[:5]), layer(rows[:5]))
    gate, up = gate_up.split(130, dim=-1)
    assert torch.allclose(rows, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_bad_prologues_are_refused():
    layer = _layer(5, 8, 16)
    packed, colsum = layer.packed_weights()
    x, out = np.zeros((1, 16), F), np.zeros((1, 8), F)
    args = (x, packed.numpy(), colsum.numpy(), layer.scale.float().numpy(), None, out, 1, 8, 16, 1)
    with pytest.raises(ValueError, match="unknown prologue"):
        _int8_gemm.linear(*args, 7)
    with pytest.raises(ValueError, match="norm weight"):
        _int8_gemm.linear(*args, 1)  # RMSNorm without its weight
    with pytest.raises(ValueError, match="norm weight"):
        _int8_gemm.linear(*args, 0, np.ones(16, F), 1e-6)
    with pytest.raises(ValueError, match="norm holds"):
        _int8_gemm.linear(*args, 1, np.ones(15, F), 1e-6)
    with pytest.raises(ValueError, match="x holds"):
        _int8_gemm.linear(*args, 2)  # SwiGLU reads 2 x 16 columns a row


def test_rotate_splits_heads_and_applies_the_rotary_embedding():
    heads, kv_heads, n, d = 4, 2, 3, 8
    gen = torch.Generator().manual_seed(6)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    angles = torch.rand(n, d // 2, generator=gen) * 10
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    q, k, v = (torch.empty(h, n, d) for h in (heads, kv_heads, kv_heads))
    _tree_attention.rotate(
        qkv.numpy(), cos.numpy(), sin.numpy(), q.numpy(), k.numpy(), v.numpy(), heads, kv_heads, n, d
    )

    def rotary(x: torch.Tensor) -> torch.Tensor:  # transformers' apply_rotary_pos_emb
        half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
        return x * cos + half * sin

    split = qkv.reshape(n, heads + 2 * kv_heads, d).transpose(0, 1)
    # the same float32 operations in the same order (the module is built without FMA contraction)
    assert torch.equal(q, rotary(split[:heads]))
    assert torch.equal(k, rotary(split[heads : heads + kv_heads]))
    assert torch.equal(v, split[heads + kv_heads :])
    buffers = [t.numpy() for t in (qkv, cos, sin, q, k, v)]
    with pytest.raises(ValueError, match="dim must be even"):
        _tree_attention.rotate(*buffers, 4, 2, 3, 7)
    with pytest.raises(ValueError, match="qkv holds"):
        _tree_attention.rotate(*buffers, 4, 1, 3, 8)
