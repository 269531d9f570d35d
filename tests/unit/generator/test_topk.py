"""The one-pass top-k of the samplers' supports: torch.topk's values, ties by smaller token ID,
the same in the AVX2 and portable scans."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from wmark.generator.cpu import _topk
from wmark.generator.logits import LogitsConfig, _top_k, supports


@pytest.fixture(params=[False, True], ids=["vector", "portable"])
def scan(request):
    _topk.use_portable(request.param)
    yield
    _topk.use_portable(False)


def _reference(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank by (value descending, id ascending): a stable sort of the negated values."""
    order = torch.from_numpy(np.argsort(-x.numpy(), axis=-1, kind="stable")[:, :k].copy())
    return torch.gather(x, 1, order), order


def test_random_rows_match_torch_topk(scan):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 151_936, generator=gen)
    values, ids = _top_k(x, 50)
    expected = torch.topk(x, 50, dim=-1, sorted=True)  # no ties in 5 x 152k normal draws
    assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)


def test_ties_go_to_the_smaller_id_and_minus_inf_comes_last(scan):
    gen = torch.Generator().manual_seed(1)
    # logits on a coarse grid: many ties, also across the k-th place; a row with 3 numbers
    # (a lookup row), one all -inf, and widths that leave a scalar tail after groups of 8
    for width in (64, 101, 1000):
        x = torch.randint(-4, 4, (4, width), generator=gen).float()
        x[1] = -math.inf
        x[1, [7, width - 1, 30]] = torch.tensor([2.0, 5.0, 2.0])
        x[2] = -math.inf
        for k in (1, 5, 50, width - 1):
            values, ids = _top_k(x, min(k, width))
            ref_values, ref_ids = _reference(x, min(k, width))
            assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids), (width, k)
        values, ids = _top_k(x, width)  # the whole row (top_k off): torch.topk, any order of ties
        assert torch.equal(values, _reference(x, width)[0])
        assert torch.equal(ids.sort(dim=-1).values, torch.arange(width).expand(4, width))


def test_supports_are_unchanged_in_meaning():
    """A lookup-like row keeps only its finite tokens; an all -inf row gives an empty support."""
    x = torch.full((2, 300), -math.inf)
    x[0, [5, 17, 200]] = torch.tensor([math.log(3), 0.0, math.log(2)])
    first, empty = supports(x, LogitsConfig(top_k=50))
    assert first.ids.tolist() == [5, 200, 17]
    assert np.allclose(first.probs, [0.5, 1 / 3, 1 / 6])
    assert empty.ids.size == 0


def test_bad_shapes_are_refused():
    x, v, i = np.zeros((2, 10), np.float32), np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="0 < k <= vocab"):
        _topk.top_k(x, v, i, 2, 10, 11)
    with pytest.raises(ValueError, match="ids holds"):
        _topk.top_k(x, v, np.zeros((2, 3), np.int32), 2, 10, 3)
    frozen = v.copy()
    frozen.setflags(write=False)
    with pytest.raises(TypeError, match="writable"):
        _topk.top_k(x, frozen, i, 2, 10, 3)
