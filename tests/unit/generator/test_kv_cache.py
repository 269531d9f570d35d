"""The in-place KV cache holds what transformers' DynamicCache holds, through growth and pruning,
and the attention kernel reads it where it lies with the same bits as from a copy."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen2Config
from transformers.cache_utils import DynamicLayer

from wmark.generator.cpu.attention import tree_attention
from wmark.generator.models.kv_cache import ROOM, SlabLayer, keep_entries, plan_moves, session_cache


def _states(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 8, generator=gen)


@torch.inference_mode()
def test_a_slab_layer_holds_what_a_dynamic_layer_holds():
    """Random appends (past the spare room, so the buffer grows twice) and prunes of random
    increasing rows, as speculative blocks make them: both layers return the same tensors."""
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    slab, plain = SlabLayer(), DynamicLayer()
    sizes = set()
    for step in range(60):
        k, v = _states(gen, rng.choice([1, 3, 7, 40]))
        got, expected = slab.update(k, v), plain.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), step
        length = plain.get_seq_length()
        assert slab.get_seq_length() == length
        committed = max(0, length - rng.randrange(1, 12))  # mostly growing, as a generation does
        tail = range(committed, length)
        rows = list(range(committed)) + sorted(rng.sample(tail, min(len(tail), rng.randrange(4))))
        slab.keep(rows)
        index = torch.tensor(rows, dtype=torch.long)
        plain.keys, plain.values = plain.keys.index_select(-2, index), plain.values.index_select(-2, index)
        assert torch.equal(slab.keys, plain.keys) and torch.equal(slab.values, plain.values), step
        assert slab._keys is not None
        sizes.add(slab._keys.shape[-2])
    assert len(sizes) >= 2 and min(sizes) > ROOM  # it grew, its rows copied, and kept spare room


@torch.inference_mode()
def test_keep_refuses_rows_out_of_order_or_past_the_end():
    layer = SlabLayer()
    layer.update(*_states(torch.Generator().manual_seed(1), 5))
    for rows in ([0, 2, 1], [0, 1, 1], [0, 1, 5], list(range(6))):
        with pytest.raises(ValueError, match="increasing"):
            layer.keep(rows)
    layer.crop(-2)
    assert layer.get_seq_length() == 3
    with pytest.raises(ValueError, match="negative"):
        layer.crop(1)


@pytest.mark.parametrize(
    "rows,first,moved",
    [([], 0, None), ([0, 1, 2], 3, None), ([0, 1, 3, 4], 2, [3, 4]), ([2, 5], 0, [2, 5]), ([0, 4], 1, [4])],
)
def test_plan_moves_finds_the_rows_already_in_place(rows, first, moved):
    got_first, got_moved, count = plan_moves(rows)
    assert (got_first, count) == (first, len(rows))
    assert (None if got_moved is None else got_moved.tolist()) == moved


def test_plan_moves_refuses_unordered_or_negative_rows():
    for rows in ([1, 0], [0, 0], [-1, 0]):
        with pytest.raises(ValueError, match="increasing"):
            plan_moves(rows)


@torch.inference_mode()
def test_a_session_cache_is_slab_layers_and_keep_entries_prunes_every_layer():
    config = Qwen2Config(num_hidden_layers=3, hidden_size=16, num_attention_heads=2, num_key_value_heads=2)
    cache = session_cache(config)
    assert [type(layer) for layer in cache.layers] == [SlabLayer] * 3
    gen = torch.Generator().manual_seed(2)
    for index in range(3):
        cache.update(*_states(gen, 6), index)
    keep_entries(cache, [0, 1, 4])
    assert cache.get_seq_length() == 3


@torch.inference_mode()
def test_attention_reads_the_cache_in_place_with_the_same_bits():
    gen = torch.Generator().manual_seed(3)
    layer = SlabLayer()
    for n in (30, 5, 2):
        layer.update(*_states(gen, n))
    keys, values = layer.keys, layer.values
    assert not keys.is_contiguous()  # the front of a larger buffer
    query = torch.randn(1, 4, 3, 8, generator=gen)
    visible = (torch.rand(3, keys.shape[2], generator=gen) < 0.7).to(torch.uint8)
    visible[:, 0] = 1
    expected = tree_attention(query, keys.contiguous(), values.contiguous(), visible, 0.35)
    assert torch.equal(tree_attention(query, keys, values, visible, 0.35), expected)
