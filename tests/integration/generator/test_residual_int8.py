"""Two-part activations (`RowInt8Linear.activations` "two"): each row quantised as itself and as what its
int8 value left. Its contract bit for bit, batch invariance with every prologue and build, the
loss it removes on heavy-tailed rows, and which models run it (a target, not a drafter)."""

from __future__ import annotations

import pytest
import torch

from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import RowInt8Linear, gemm_threads_for
from wmark.generator.models import int8_store
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import _load_model
from wmark.generator.models.prepare import prepare_model

BACKENDS = _int8_gemm.backends()


def _layer(seed: int, out: int = 70, inp: int = 200, bias: bool = True) -> RowInt8Linear:
    """Shapes off the kernel's grain: 70 channels (tiles of 32), 200 columns."""
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    layer = RowInt8Linear(weight, scale, torch.randn(out, generator=gen) if bias else None)
    layer.activations = "two"
    return layer


def _heavy_rows(seed: int, count: int, width: int) -> torch.Tensor:
    """Rows like silu(gate) * up: mostly small, a few channels per row a hundred times larger."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, width, generator=gen)
    spikes = torch.randint(0, width, (count, 3), generator=gen)
    x.scatter_(1, spikes, 100.0 * torch.randn(count, 3, generator=gen))
    return x


def _one_part(layer: RowInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The one-part contract without bias, in torch: q = round(x * (127 / peak)), exact integer
    sums, then float32 times the channel scale, times peak / 127."""
    weight, scale = layer.int8_weight()
    peak = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    q = torch.round(x * (127.0 / peak))
    return (q.double() @ weight.double().T).float() * scale.float() * (peak / 127.0)


def _reference(layer: RowInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The two-part contract: the row's output, plus that of its residual (the row minus q times
    peak / 127, in float32), then the bias, in that order."""
    peak = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    q = torch.round(x * (127.0 / peak))
    residual = x - q * (peak / 127.0)
    out = _one_part(layer, x) + _one_part(layer, residual)
    return out if layer.bias is None else out + layer.bias


def test_the_output_is_both_parts_exact_products_added(backend):
    for bias in (True, False):
        layer = _layer(1, bias=bias)
        x = _heavy_rows(2, 17, 200)
        assert torch.equal(layer(x), _reference(layer, x)), (backend, bias)


@pytest.mark.parametrize("activations", ["two", "outliers"])  # outliers: test_outlier_int8.py
def test_rows_alone_equal_rows_in_any_batch_with_every_prologue(backend, activations):
    layer = _layer(3)
    layer.activations = activations
    x = _heavy_rows(4, 40, 400)  # SwiGLU reads gate, then up; the others the first 200 columns
    norm = torch.rand(200, generator=torch.Generator().manual_seed(5)) + 0.5
    runs = {
        "plain": lambda rows: layer(rows[:, :200]),
        "rms": lambda rows: layer.rms_forward(rows[:, :200], norm, 1e-6),
        "swiglu": lambda rows: layer.swiglu_forward(rows),
    }
    for name, run in runs.items():
        alone = torch.cat([run(x[i : i + 1]) for i in range(40)])
        # across the kernels' row blocks and, at 32 rows and more, the rows phase on the pool
        for rows in (2, 5, 12, 13, 33, 40):
            assert torch.equal(run(x[:rows]), alone[:rows]), (backend, activations, name, rows)


def test_every_build_gives_the_same_bits():
    layer = _layer(6, out=300, inp=192)
    x = _heavy_rows(7, 40, 192)
    expected = _reference(layer, x)
    try:
        for name in BACKENDS:
            _int8_gemm.use_backend(name)
            # under "amx": one row (2 quantised) on VNNI; 2 rows and more (4+) on tiles, 7 rows
            # (14) in one padded tile, 40 (80) in blocks of 32
            for rows in (1, 2, 3, 7, 40):
                assert torch.equal(layer(x[:rows]), expected[:rows]), (name, rows)
    finally:
        _int8_gemm.use_backend(BACKENDS[0])


def test_a_call_split_across_threads_adds_each_pair_once_with_the_same_bits(backend):
    """The tiles' epilogue adds a row's two parts (no (2m, n) buffer of both outputs): with the
    channels split between threads, every output once, the same bits at any thread count."""
    layer = _layer(8, out=700, inp=128)
    x = _heavy_rows(9, 30, 128)
    expected = _reference(layer, x)
    for count in (1, 2, 3, 7, 2):
        with gemm_threads_for(count):
            assert torch.equal(layer(x), expected), (backend, count)
            assert torch.equal(layer(x[:3]), expected[:3]), (backend, count)


def test_two_parts_take_heavy_tailed_rows_near_the_float_product():
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(64, 1024, generator=gen)
    layer = RowInt8Linear(*RowInt8Linear.quantize(weight), None)
    x = _heavy_rows(9, 32, 1024)
    dequantised = layer.int8_weight()[0].float() * layer.scale.float()[:, None]
    exact = x.double() @ dequantised.double().T  # the weights' own rounding left aside
    one = (layer(x) - exact).norm()
    layer.activations = "two"
    two = (layer(x) - exact).norm()
    # The residual's error is at most a level of a level (its peak <= half the row's step), so
    # about 250x below one part's; measured 207x with these seeds (every build gives these bits).
    # 50x leaves room for any seed's spread of peaks.
    assert two * 50 < one, (float(two), float(one))


def _logits(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    session = HFModel(model, frozenset({0})).session(prompt)
    root, _ = session.extend([], [])
    _, tree = session.extend([-1, -1, 0], [11, 12, 13])
    return torch.cat([root[None], tree])


def test_a_prepared_model_runs_every_int8_layer_in_two_parts_and_stays_invariant(tiny_qwen, tmp_path):
    cache = tmp_path / "int8.safetensors"
    first = prepare_model(tiny_qwen(3), "int8", "cpu", int8_cache=cache, activations="two")
    layers = int8_layers(first)  # fused q/k/v and gate/up groups included
    assert len(layers) == 2 * 4 + 1 and all(layer.activations == "two" for layer in layers)
    # from the packed cache: the same weights, the flag set by the load, not stored
    second = prepare_model(tiny_qwen(3), "int8", "cpu", int8_cache=cache, activations="two")
    prompt = [5, 17, 42, 99, 3]
    assert torch.equal(_logits(first, prompt), _logits(second, prompt))
    one_part = prepare_model(tiny_qwen(3), "int8", "cpu", int8_cache=cache)
    assert all(layer.activations == "one" for layer in int8_layers(one_part))
    assert not torch.equal(_logits(first, prompt), _logits(one_part, prompt))
    # A token decoded alone gets the logits it gets inside a tree, after the same prompt prefill.
    # (The prefill attends through SDPA, every later forward through the tree kernel: the two
    # differ in the last bits, which a second part carries on. Every sampler prefills the same
    # prompt the same way, and every generated token goes through the kernel.)
    session = HFModel(first, frozenset({0})).session(prompt)
    session.extend([], [])
    _, tree = session.extend([-1, -1, 0], [11, 12, 13])
    alone = HFModel(first, frozenset({0})).session(prompt)
    alone.extend([], [])
    alone.accept([], [11])
    assert torch.equal(alone.extend([], [])[0], tree[0])


def test_a_cache_packed_with_down_projection_blocks_is_stale(tiny_qwen, tmp_path):
    cache = tmp_path / "int8.safetensors"
    prepare_model(tiny_qwen(3), "int8", "cpu", int8_cache=cache)
    assert int8_store.is_packed(cache) and not int8_store.is_stale(cache)
    import safetensors.torch

    tensors = safetensors.torch.load_file(str(cache))
    safetensors.torch.save_file(tensors, str(cache), metadata={"format": "wmark-int8-packed/2"})
    assert int8_store.is_stale(cache) and not int8_store.is_packed(cache)


@pytest.mark.parametrize("target", [True, False])
def test_load_model_runs_a_target_in_two_parts_and_a_drafter_in_one(tiny_qwen, tmp_path, monkeypatch, target):
    monkeypatch.setenv("WMARK_MODEL_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model"
    tiny_qwen(5).save_pretrained(source)
    model = _load_model(source, "int8", "cpu", target=target)
    assert {layer.activations for layer in int8_layers(model)} == {"two" if target else "one"}
