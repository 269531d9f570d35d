"""`RowInt8Linear` on wmark's int8 GEMM: a row's output does not depend on its batch, on the
kernel build or on the thread count, and equals the exact dequantised product bit for bit."""

from __future__ import annotations

import copy
import itertools
import os
import signal
import time

import pytest
import torch

from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import RowInt8Linear, gemm_threads, gemm_threads_for

BACKENDS = _int8_gemm.backends()  # this CPU's builds, fastest first; "portable" runs everywhere
PREFETCH = _int8_gemm.prefetch()  # this CPU's weight prefetch policy


def _layer(seed: int, out: int = 70, inp: int = 97, bias: bool = True) -> RowInt8Linear:
    """Shapes off the kernel's grain on purpose: 70 channels (tiles of 32), 97 columns (groups of 4)."""
    gen = torch.Generator().manual_seed(seed)
    weight, scale = RowInt8Linear.quantize(torch.randn(out, inp, generator=gen))
    return RowInt8Linear(weight, scale, torch.randn(out, generator=gen) if bias else None)


def _reference(layer: RowInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's contract in torch: each row quantised with its own peak as
    `round(x * (127 / peak))`, the integer sums exact (float64 holds them exactly), then float32:
    times the channel scale, times peak / 127, plus the bias, in that order."""
    weight, scale = layer.int8_weight()
    peak = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    q = torch.round(x * (127.0 / peak))
    sums = (q.double() @ weight.double().T).float()
    out = sums * scale.float() * (peak / 127.0)
    return out if layer.bias is None else out + layer.bias


def _rows(seed: int, count: int, width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # rows of very different magnitude: each is quantised with its own peak
    return torch.randn(count, width, generator=gen) * torch.logspace(-3, 3, count)[:, None]


def test_the_output_is_the_exact_dequantised_product(backend):
    for bias in (True, False):
        layer = _layer(2, bias=bias)
        x = _rows(3, 30, 97)
        assert torch.equal(layer(x), _reference(layer, x)), (backend, bias)


def test_rows_alone_equal_rows_in_any_batch(backend):
    layer = _layer(0)
    x = _rows(1, 30, 97)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(30)])
    # across the kernels' row blocks (4 rows with AVX2, 12 with AVX-512) and their remainders
    for rows in (2, 3, 4, 5, 11, 12, 13, 25, 30):
        assert torch.equal(layer(x[:rows]), alone[:rows]), (backend, rows)


def test_blocks_on_the_tile_unit_equal_rows_alone(backend):
    """Widths that are whole 64-column chunks and 4 rows or more run on AMX tiles under the
    "amx" build (the other builds run them as any block): row blocks of 32 and 16, a tile of
    4-15 rows and zero rows padding it, channels past a tile's end, and (8,960 columns: panels
    of 64 rows) a block that spans two panels."""
    for inp, counts in ((128, (4, 5, 15, 16, 17, 31, 32, 33, 48, 49)), (8960, (100,))):
        layer = _layer(11, out=70, inp=inp)
        x = _rows(12, max(counts), inp)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(max(counts))])  # one row: never tiles
        assert torch.equal(alone, _reference(layer, x)), backend
        for rows in counts:
            assert torch.equal(layer(x[:rows]), alone[:rows]), (backend, inp, rows)


def test_every_build_and_thread_count_gives_the_same_bits():
    try:
        # 130 columns: vector code in every build; 192 columns x 40 rows: AMX tiles under "amx";
        # x 100 rows: the rows are also quantised on the pool's threads (19,200 elements)
        for inp, rows in ((130, 17), (192, 40), (192, 100)):
            layer = _layer(4, out=300, inp=inp)
            x = _rows(5, rows, inp)
            expected = _reference(layer, x)
            for name, policy in itertools.product(BACKENDS, ("near", "far", "rows")):
                _int8_gemm.use_backend(name)
                _int8_gemm.prefetch(policy)
                # up and down: calls with fewer threads than the pool has workers, and more
                # threads than tiles (300 channels: 10 tiles)
                for count in (1, 2, 3, 7, 12, 2, 5, 1, 3):
                    with gemm_threads_for(count):
                        assert torch.equal(layer(x), expected), (name, policy, inp, count)
                assert torch.equal(layer(x[:1]), expected[:1])
    finally:
        _int8_gemm.use_backend(BACKENDS[0])
        _int8_gemm.prefetch(PREFETCH)


def test_late_workers_never_mix_two_calls():
    """With more threads than cores and workers that sleep between calls, most workers wake after
    their call is over (the caller never waits for them) or in the middle of the next one: each
    claims chunks only of the call it can see, so every output is still exact. Two layers of
    different shapes alternate, so a chunk computed with the other call's parameters would show."""
    layers = [_layer(13, out=700, inp=130), _layer(14, out=333, inp=64, bias=False)]
    xs = [_rows(15, 3, 130), _rows(16, 1, 64)]
    expected = [_reference(layer, x) for layer, x in zip(layers, xs, strict=True)]
    policy = _int8_gemm.wait_policy()
    try:
        for wait in ("passive", "active"):
            _int8_gemm.wait_policy(wait)
            for count in (2 * (os.cpu_count() or 1) + 2, 3, 2):
                with gemm_threads_for(count):
                    for i in range(400):
                        j = i % 2
                        assert torch.equal(layers[j](xs[j]), expected[j]), (wait, count, i)
    finally:
        _int8_gemm.wait_policy(policy)


def test_the_wait_policy_and_thread_count_are_checked():
    policy = _int8_gemm.wait_policy()
    try:
        assert _int8_gemm.wait_policy("passive") == "passive"
        assert _int8_gemm.wait_policy() == "passive"
        assert _int8_gemm.wait_policy("active") == "active"
        with pytest.raises(ValueError, match="'active' or 'passive'"):
            _int8_gemm.wait_policy("spin")
    finally:
        _int8_gemm.wait_policy(policy)
    with pytest.raises(ValueError, match="positive"), gemm_threads_for(0):
        pass
    with gemm_threads_for(3), gemm_threads_for(None):
        assert gemm_threads() == 3  # None keeps the enclosing count
    assert gemm_threads() == torch.get_num_threads()


def test_a_forked_child_computes_on_threads_of_its_own():
    """The parent's worker threads do not exist in a fork: the child must start its own, not wait
    for the parent's forever (a server or a scan may fork after the kernel ran). On an AMX CPU
    the 40-row call also checks that the child holds the tile-state grant."""
    layer, wide = _layer(9, out=300, inp=130), _layer(9, out=300, inp=128)
    x, y = _rows(10, 5, 130), _rows(10, 40, 128)
    with gemm_threads_for(3):
        expected = layer(x), wide(y)  # the parent's pool now has workers
        pid = os.fork()
        if pid == 0:  # the child: report by exit status only
            ok = torch.equal(layer(x), expected[0]) and torch.equal(wide(y), expected[1])
            os._exit(0 if ok else 1)
        deadline = time.monotonic() + 120  # generous on a busy machine: the work is ~1 ms
        while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        if waited == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung waiting for its parent's worker threads")
        assert os.waitstatus_to_exitcode(waited[1]) == 0


def test_the_largest_products_do_not_saturate(backend):
    """Every weight and activation at +-127 over the widest input of the embedded target (8,960):
    pairs of products overflow int16 (2 x 127 x 127 + ...) in kernels that add them there, and
    the sums reach 144.5 million (int32 holds them)."""
    inp = 8960
    weight = torch.full((40, inp), 127, dtype=torch.int8)
    weight[1::2] = -127
    layer = RowInt8Linear(weight, torch.ones(40, dtype=torch.float64), None)
    x = torch.ones(3, inp)
    x[1] = -1.0
    x[2, ::2] = -1.0  # mixed signs: the sums cancel exactly
    exact = 127.0 * 127 * inp
    out = layer(x)
    assert torch.equal(out[0], torch.tensor([exact, -exact] * 20) * (1.0 / 127))
    assert torch.equal(out[1], -out[0])
    assert torch.equal(out[2], torch.zeros(40))


def test_zero_and_tiny_rows():
    layer = _layer(6)
    x = torch.zeros(2, 97)
    x[1, 5] = 1e-35  # below the peak's floor of 1e-30: quantises to 0
    assert torch.equal(layer(x), layer.bias.detach().expand(2, -1))


def test_packing_round_trip_and_packed_layers():
    layer = _layer(7)
    weight, scale = layer.int8_weight()
    assert not layer.packed and weight is layer.int8_weight()[0]  # stacking needs no unpack
    x = _rows(8, 4, 97)
    before = _reference(layer, x)
    packed, colsum = layer.packed_weights()
    assert layer.packed and layer.int8_weight()[0].equal(weight)  # the same weights back
    assert colsum[:70].equal(weight.sum(dim=1, dtype=torch.int32)) and not colsum[70:].any()
    again = RowInt8Linear.from_packed(packed, colsum, (70, 97), scale, layer.bias)
    assert torch.equal(again(x), before) and torch.equal(layer(x), before)
    assert torch.equal(copy.deepcopy(layer)(x), before)
    with pytest.raises(ValueError, match="do not fit"):
        RowInt8Linear.from_packed(packed, colsum, (70, 96), scale, None)


def test_the_kernel_refuses_bad_buffers():
    weight = torch.zeros(4, 8, dtype=torch.int8)
    packed = torch.zeros(_int8_gemm.packed_size(4, 8), dtype=torch.uint8)
    colsum = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(ValueError, match="weight holds 32 bytes, the shape needs 40"):
        _int8_gemm.pack(weight.numpy(), packed.numpy(), colsum.numpy(), 5, 8)
    with pytest.raises(ValueError, match="positive"):
        _int8_gemm.packed_size(0, 8)
    out = torch.empty(1, 4)
    with pytest.raises(ValueError, match="x holds 28 bytes"):
        _int8_gemm.linear(
            torch.zeros(1, 7).numpy(),
            packed.numpy(),
            colsum.numpy(),
            torch.ones(4).numpy(),
            None,
            out.numpy(),
            1,
            4,
            8,
            1,
        )
    with pytest.raises(ValueError, match="does not run on this CPU"):
        _int8_gemm.use_backend("avx1024")
    with pytest.raises(ValueError, match="not 'near', 'far' or 'rows'"):
        _int8_gemm.prefetch("l3")
    assert _int8_gemm.prefetch() == PREFETCH
    assert _int8_gemm.backend() == BACKENDS[0] and BACKENDS[-1] == "portable"
