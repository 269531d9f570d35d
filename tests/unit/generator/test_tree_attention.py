"""The C tree-attention kernel (wmark.generator.cpu._tree_attention): each row's output is a function of
its query and its visible keys in cache order only (bit for bit), and it is attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmark.generator.cpu import _tree_attention
from wmark.generator.cpu.attention import rowwise_attention


def _case(rng: np.random.Generator, heads: int, kv_heads: int, nq: int, nkv: int, dim: int):
    q = rng.standard_normal((heads, nq, dim), dtype=np.float32)
    k = rng.standard_normal((kv_heads, nkv, dim), dtype=np.float32)
    v = rng.standard_normal((kv_heads, nkv, dim), dtype=np.float32)
    # a tree after a committed prefix: each row sees the prefix, a random set of other tree
    # nodes (its "ancestors"), and itself
    prefix = nkv - nq
    visible = np.zeros((nq, nkv), dtype=np.uint8)
    visible[:, :prefix] = 1
    for i in range(nq):
        visible[i, prefix + np.flatnonzero(rng.random(i) < 0.5)] = 1
        visible[i, prefix + i] = 1
    return q, k, v, visible


def _attend(q, k, v, visible, scaling, threads=1):
    heads, nq, dim = q.shape
    kv_heads, nkv, _ = k.shape
    out = np.empty((nq, heads, dim), dtype=np.float32)
    _tree_attention.attend(q, k, v, visible, out, heads, kv_heads, nq, nkv, dim, scaling, nkv, threads)
    return out


def _reference(q, k, v, visible, scaling):
    """Masked softmax attention in float64 (GQA: query head h reads key/value head h // group)."""
    heads, nq, dim = q.shape
    group = heads // k.shape[0]
    out = np.empty((nq, heads, dim))
    for h in range(heads):
        kh, vh = k[h // group].astype(np.float64), v[h // group].astype(np.float64)
        scores = q[h].astype(np.float64) @ kh.T * scaling
        scores[visible == 0] = -np.inf
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (weights / weights.sum(axis=1, keepdims=True)) @ vh
    return out


SHAPES = [(12, 2, 6, 40, 128), (4, 4, 3, 9, 64), (6, 1, 5, 33, 20)]  # Qwen2.5-1.5B's heads; MHA; a dim tail
BUILDS = ["native", "baseline"]  # the CPU's own build (AVX2 where it has it) and the portable one


@pytest.fixture(params=BUILDS)
def build(request):
    _tree_attention.use_baseline(request.param == "baseline")
    yield request.param
    _tree_attention.use_baseline(False)


def test_the_cpu_picks_its_build():
    assert _tree_attention.backend() in ("avx2", "baseline")
    _tree_attention.use_baseline(True)
    try:
        assert _tree_attention.backend() == "baseline"
    finally:
        _tree_attention.use_baseline(False)


@pytest.mark.parametrize("heads,kv_heads,nq,nkv,dim", SHAPES)
def test_matches_float64_attention(build, heads, kv_heads, nq, nkv, dim):
    rng = np.random.default_rng(heads * 1000 + nkv)
    q, k, v, visible = _case(rng, heads, kv_heads, nq, nkv, dim)
    got = _attend(q, k, v, visible, dim**-0.5)
    want = _reference(q, k, v, visible, dim**-0.5)
    # float32 sums of at most nkv terms of size <= max|v|: n * 2^-24 relative error each, so
    # 1e-5 of max|v| (~4) leaves ~10x headroom for nkv = 40 (a wrong mask or scale is off by ~0.1)
    assert np.abs(got - want).max() < 1e-5 * np.abs(v).max() * max(1, nkv / 40)


@pytest.mark.parametrize("heads,kv_heads,nq,nkv,dim", SHAPES)
def test_a_row_is_its_context_decoded_alone(build, heads, kv_heads, nq, nkv, dim):
    """A tree row equals, bit for bit, the same query over its visible keys gathered into a cache of
    their own (how the context looks when its tokens are decoded one by one), and equals itself
    computed alone or beside any other rows."""
    rng = np.random.default_rng(7 + nq)
    q, k, v, visible = _case(rng, heads, kv_heads, nq, nkv, dim)
    batch = _attend(q, k, v, visible, dim**-0.5)
    for i in range(nq):
        idx = np.flatnonzero(visible[i])
        alone = _attend(
            np.ascontiguousarray(q[:, i : i + 1]),
            np.ascontiguousarray(k[:, idx]),
            np.ascontiguousarray(v[:, idx]),
            np.ones((1, idx.size), dtype=np.uint8),
            dim**-0.5,
        )
        assert np.array_equal(alone[0], batch[i]), i
        pair = [i, (i + 1) % nq]
        beside = _attend(
            np.ascontiguousarray(q[:, pair]), k, v, np.ascontiguousarray(visible[pair]), dim**-0.5
        )
        assert np.array_equal(beside[0], batch[i]), i


@pytest.mark.parametrize("heads,kv_heads,nq,nkv,dim", [*SHAPES, (12, 2, 20, 300, 128), (14, 2, 1, 500, 64)])
def test_threads_do_not_change_a_bit(build, heads, kv_heads, nq, nkv, dim):
    """The (row, key/value head) units run on the GEMM's pool when a call is large enough (the last
    two shapes: a verify tree and a draft model's one-row decode, both past the pool's threshold);
    which thread computed a unit, and how the units were cut into chunks, leaves every bit as one
    thread computes it."""
    assert _tree_attention.pooled()  # the pool loaded: threads > 1 really reach it
    rng = np.random.default_rng(11 + nkv)
    q, k, v, visible = _case(rng, heads, kv_heads, nq, nkv, dim)
    one = _attend(q, k, v, visible, dim**-0.5)
    for threads in (2, 3, 8):
        assert np.array_equal(_attend(q, k, v, visible, dim**-0.5, threads), one), threads


def test_attention_and_gemm_calls_share_the_pool_from_many_threads():
    """Python threads calling the kernel and the int8 GEMM at once (the server's threads, a draft
    model on its own thread) take turns on the pool: every call gets the result it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    from wmark.generator.cpu import _int8_gemm

    rng = np.random.default_rng(5)
    q, k, v, visible = _case(rng, 12, 2, 9, 200, 128)
    want = _attend(q, k, v, visible, 0.1)
    n, kdim, m = 96, 64, 5
    weight = rng.integers(-127, 128, (n, kdim), dtype=np.int8)
    packed = np.zeros(_int8_gemm.packed_size(n, kdim), dtype=np.uint8)
    colsum = np.zeros(((n + 31) // 32) * 32, dtype=np.int32)
    _int8_gemm.pack(weight, packed, colsum, n, kdim)
    x = rng.standard_normal((m, kdim), dtype=np.float32)
    scale = np.full(n, 0.01, dtype=np.float32)

    def gemm():
        out = np.empty((m, n), dtype=np.float32)
        _int8_gemm.linear(x, packed, colsum, scale, None, out, m, n, kdim, 2)
        return out

    gemm_want = gemm()
    with ThreadPoolExecutor(4) as pool:
        attends = [pool.submit(_attend, q, k, v, visible, 0.1, 2) for _ in range(12)]
        gemms = [pool.submit(gemm) for _ in range(12)]
        assert all(np.array_equal(f.result(), want) for f in attends)
        assert all(np.array_equal(f.result(), gemm_want) for f in gemms)


def test_rowwise_attention_takes_the_4d_mask_and_gqa_layout(build):
    rng = np.random.default_rng(3)
    q, k, v, visible = _case(rng, 12, 2, 4, 30, 16)
    hidden = torch.from_numpy(visible == 0)[None, None]
    mask = torch.zeros(1, 1, 4, 30).masked_fill(hidden, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    out, _ = rowwise_attention(
        module,
        torch.from_numpy(q)[None].transpose(2, 3).contiguous().transpose(2, 3),  # a non-contiguous view
        torch.from_numpy(k)[None],
        torch.from_numpy(v)[None],
        mask,
        0.25,
    )
    assert out.shape == (1, 4, 12, 16)
    assert np.array_equal(out[0].numpy(), _attend(q, k, v, visible, 0.25))


def test_bad_input_is_refused():
    q, k, v, visible = _case(np.random.default_rng(0), 4, 2, 2, 5, 8)
    out = np.empty((2, 4, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="bad shape"):
        _tree_attention.attend(q, k, v, visible, out, 4, 3, 2, 5, 8, 1.0)
    with pytest.raises(ValueError, match="k holds"):
        _tree_attention.attend(q, k[:, :4].copy(), v, visible, out, 4, 2, 2, 5, 8, 1.0)
    with pytest.raises(TypeError, match="out must be"):
        _tree_attention.attend(q, k, v, visible, out.tobytes(), 4, 2, 2, 5, 8, 1.0)
    with pytest.raises(ValueError, match="float32 on the CPU"):
        rowwise_attention(
            torch.nn.Module(),
            torch.zeros(1, 4, 2, 8, dtype=torch.float64),
            torch.zeros(1, 2, 5, 8, dtype=torch.float64),
            torch.zeros(1, 2, 5, 8, dtype=torch.float64),
            torch.zeros(1, 1, 2, 5),
            1.0,
        )
