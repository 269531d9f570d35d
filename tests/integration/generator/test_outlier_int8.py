"""Outlier activations (`RowInt8Linear.activations` "outliers"): each row's 16 largest channels
by magnitude multiplied in float32, the rest as one int8 part. Its contract bit for bit (which
channels, in which order, the float part's operations), the same bits in every build and at
any thread count, the loss it removes on heavy-tailed rows, `--precision int8-fast` and where
"auto" picks it. Batch
invariance with every prologue is tested with two parts' in test_residual_int8.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import BackendError
from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import ACTIVATIONS, SCALE_COLS, RowInt8Linear, gemm_threads_for
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models import prepare
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.loading import load_pair

BACKENDS = _int8_gemm.backends()
OUTLIERS = 16


def _layer(seed: int, out: int = 70, inp: int = 200, bias: bool = True) -> RowInt8Linear:
    """Shapes off the kernel's grain: 70 channels (tiles of 32, the last one partly filled)."""
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    layer = RowInt8Linear(weight, scale, torch.randn(out, generator=gen) if bias else None)
    layer.activations = "outliers"
    return layer


def _heavy_rows(seed: int, count: int, width: int, spikes: int = 20) -> torch.Tensor:
    """Rows like silu(gate) * up: mostly small, some channels per row a hundred times larger
    (more than 16, so the largest left in the int8 part still sets its scale)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, width, generator=gen)
    where = torch.randint(0, width, (count, spikes), generator=gen)
    x.scatter_(1, where, 100.0 * torch.randn(count, spikes, generator=gen))
    return x


def _chosen(row: np.ndarray) -> list[int]:
    """The row's 16 channels: by magnitude, larger first, ties to the lower channel; ascending."""
    order = sorted(range(len(row)), key=lambda c: (-abs(float(row[c])), c))
    return sorted(order[:OUTLIERS])


def _reference(layer: RowInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The contract in torch: the rest's one-part output (q = round(x * (127 / peak)), exact
    integer sums, float32 times the channel scale, times peak / 127), plus the bias, plus the
    float part (w[c, i] * v summed over the chosen channels in ascending order, from 0) times
    the channel scale, every step in float32."""
    weight, scale = layer.int8_weight()
    rows = []
    for row in x:
        chosen = _chosen(row.numpy())
        rest = row.clone()
        rest[chosen] = 0.0
        peak = rest.abs().amax().clamp_min(1e-30)
        q = torch.round(rest * (127.0 / peak))
        out = (q.double() @ weight.double().T).float() * scale.float() * (peak / 127.0)
        if layer.bias is not None:
            out = out + layer.bias.detach()
        side = torch.zeros(layer.out_features)
        for c in chosen:
            side = side + weight[:, c].float() * row[c]
        rows.append(out + side * scale.float())
    return torch.stack(rows)


def test_the_output_is_the_rest_in_int8_plus_the_outliers_in_float(backend):
    for bias in (True, False):
        layer = _layer(1, bias=bias)
        x = _heavy_rows(2, 17, 200)
        assert torch.equal(layer(x), _reference(layer, x)), (backend, bias)


def test_ties_go_to_the_lower_channel(backend):
    layer = _layer(3, inp=64)
    x = torch.ones(2, 64)  # every channel ties: the first 16 are the float ones
    x[1, 40] = 2.0  # one larger: it and the first 15
    expected = _reference(layer, x)
    assert _chosen(x[0].numpy()) == list(range(16))
    assert _chosen(x[1].numpy()) == [*range(15), 40]
    assert torch.equal(layer(x), expected), backend


def test_every_build_gives_the_same_bits_at_any_thread_count():
    layer = _layer(7, out=300, inp=192)
    x = _heavy_rows(8, 40, 192)
    expected = _reference(layer, x)
    try:
        for name in BACKENDS:
            _int8_gemm.use_backend(name)  # "amx" runs an outlier call's tiles on VNNI
            for rows in (1, 2, 3, 7, 40):
                for threads in (1, 2, 3):
                    with gemm_threads_for(threads):
                        assert torch.equal(layer(x[:rows]), expected[:rows]), (name, rows, threads)
    finally:
        _int8_gemm.use_backend(BACKENDS[0])


def test_outliers_take_heavy_tailed_rows_near_the_float_product():
    gen = torch.Generator().manual_seed(9)
    layer = RowInt8Linear(*RowInt8Linear.quantize(torch.randn(64, 1024, generator=gen)), None)
    x = _heavy_rows(10, 32, 1024, spikes=12)  # 12 spikes a row: all of them go to the float part
    dequantised = layer.int8_weight()[0].float() * layer.scale.float()[:, None]
    exact = x.double() @ dequantised.double().T  # the weights' own rounding left aside
    one = (layer(x) - exact).norm()
    layer.activations = "outliers"
    outliers = (layer(x) - exact).norm()
    # With every spike in float, the int8 part's step follows the small channels (peak ~3.5
    # instead of ~250): its error falls by about that ratio, ~70x; 20x leaves room for any
    # seed's spread of peaks.
    assert outliers * 20 < one, (float(outliers), float(one))


def test_bad_modes_are_refused():
    layer = _layer(11)
    out = np.empty((1, 70), dtype=np.float32)
    packed, colsum = (t.numpy() for t in layer.packed_weights())
    scale = layer.scale.float().numpy()
    x = np.ones((1, 200), dtype=np.float32)
    with pytest.raises(ValueError, match="unknown activations"):
        _int8_gemm.linear(x, packed, colsum, scale, None, out, 1, 70, 200, 1, 0, None, 0.0, 3)
    with pytest.raises(ValueError, match="8-bit weights"):
        outliers = ACTIVATIONS["outliers"]
        _int8_gemm.linear4(x, packed, colsum, scale, None, out, 1, 70, 200, 1, 0, None, 0.0, outliers)


def test_int8_fast_runs_the_target_with_outliers_on_block_weights(word_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WMARK_MODEL_CACHE", str(tmp_path / "cache"))
    source = str(word_model_dir(tmp_path / "model", 0))
    fast = load_pair(source, source, precision="int8-fast", threads=1)
    plain = load_pair(source, None, precision="int8", threads=1)
    assert fast.drafter is not None
    fast_layers, plain_layers = int8_layers(fast.target.model), int8_layers(plain.target.model)
    assert {layer.activations for layer in fast_layers} == {"outliers"}
    assert {layer.activations for layer in int8_layers(fast.drafter.model)} == {"one"}  # it only proposes
    assert {layer.activations for layer in plain_layers} == {"two"}
    assert {layer.scale_cols for layer in fast_layers} == {SCALE_COLS}  # the target's weights: block scales
    assert {layer.scale_cols for layer in int8_layers(fast.drafter.model)} == {0}
    assert {layer.scale_cols for layer in plain_layers} == {0}
    for a, b in zip(fast_layers, plain_layers, strict=True):  # the same float weights behind both:
        # each within half its step of them, a block's step at most its channel's: apart <= a step
        step = float(b.scale.max()) * (1 + 1e-9)
        assert torch.allclose(a.dequantised(), b.dequantised(), rtol=0, atol=step)
    # batch invariance holds for the target's rows: speculative decoding emits basic-uwm's tokens
    prompt = fast.encode_prompt("w3 w4 w5 w6 w3 w4", chat=False)
    ref = TokenizerRef(name="words", sha256=fast.tokenizer_sha256, vocab_size=fast.target.vocab_size)
    key = KeyMaterial(key_id="wk_fast", secret=Secret(b"k" * 32), spec=WatermarkSpec(tokenizer=ref))
    runs = {
        method: generate(
            fast.target,
            prompt,
            config=SamplerConfig(method=method, max_new_tokens=24),
            key=key,
            drafter=fast.drafter,
            seed=1,
        ).token_ids
        for method in ("basic-uwm", "mpfr", "pfr")
    }
    assert runs["basic-uwm"] == runs["mpfr"] == runs["pfr"]


def test_int8_fast_is_refused_off_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(BackendError, match="int8-fast is CPU-only"):
        load_pair("embedded", None, device="cuda", precision="int8-fast")


@pytest.mark.parametrize(("builds", "expected"), [(["amx", "avx512vnni"], "int8"), (["avx2"], "int8-fast")])
def test_auto_is_int8_with_amx_tiles_and_int8_fast_elsewhere(
    builds, expected, word_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("WMARK_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(prepare._int8_gemm, "backends", lambda: builds)
    assert prepare.cpu_precision() == expected
    source = str(word_model_dir(tmp_path / "model", 0))
    pair = load_pair(source, None, precision="auto", threads=1)
    rows = {"int8": "two", "int8-fast": "outliers"}[expected]
    assert {layer.activations for layer in int8_layers(pair.target.model)} == {rows}
