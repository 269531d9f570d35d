"""A KV cache that grows in place: a forward writes its keys into spare room, `accept` moves a few.

transformers' `DynamicCache` concatenates every layer's keys and values with each forward, a
copy of the whole cache per layer and forward, and a session's `accept` used to index-select
the committed entries and the accepted path out of every layer, another copy. With the 1.5B
target's 28 layers at ~250 tokens of context that is ~14 MB of copying per speculative block,
and as much again per drafter level. `SlabLayer` keeps each layer's keys and values at the
front of a buffer with room to grow (doubling when full): a forward copies only its new rows,
and `keep` leaves the committed text where it is and moves the accepted path's few rows down
behind it. The attention kernel reads the front of the buffer where it lies
(`wmark.generator.cpu.attention.tree_attention`), SDPA and transformers take the strided view.

The numbers are the same as with `DynamicCache`: the same keys and values, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer

__all__ = ["ROOM", "SlabLayer", "keep_entries", "plan_moves", "session_cache"]

ROOM = 256
"""Rows of spare room a buffer gets beyond what it first holds (it doubles when full)."""


class SlabLayer(DynamicLayer):  # type: ignore[misc]  # transformers is untyped here (pyproject)
    """One layer's keys and values at the front of buffers that grow in place (see the module)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._arrays: tuple[Any, Any] | None = None  # numpy views of the buffers' first batch entry

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        *args: Any,  # noqa: ARG002 - transformers passes cache kwargs we do not use
        **kwargs: Any,  # noqa: ARG002
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new rows (batch, heads, n, dim); return views of all rows so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self._keys is None or self._values is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        assert self._keys is not None and self._values is not None
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self._show(end)
        return self.keys, self.values

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[Any, Any, int]:
        """`update` for wmark's lean decoder (batch 1): append the rows and return the whole
        buffers as numpy arrays (kv_heads, capacity, dim), rows past the count unused, and the
        row count: the tree kernel reads them where they lie, with no view made per call."""
        end = self.length + key_states.shape[-2] if self.is_initialized else 0
        arrays = self._arrays if self.is_initialized else None
        if arrays is None or end > arrays[0].shape[1]:  # the first rows, or the buffers grow
            self.update(key_states, value_states)
            assert self._keys is not None and self._values is not None
            self._arrays = arrays = (self._keys[0].numpy(), self._values[0].numpy())
        else:
            arrays[0][:, self.length : end] = key_states[0].numpy()
            arrays[1][:, self.length : end] = value_states[0].numpy()
            self._show(end)
        return arrays[0], arrays[1], self.length

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> None:
        """Buffers for at least `end` rows plus `ROOM`, the rows so far copied to their front."""
        size = end + ROOM if self._keys is None else max(end + ROOM, 2 * self._keys.shape[-2])
        keys = key_states.new_empty((*key_states.shape[:2], size, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:2], size, value_states.shape[-1]))
        if self._keys is not None and self._values is not None and self.length:
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values
        self._arrays = None

    def _show(self, length: int) -> None:
        assert self._keys is not None and self._values is not None
        self.length = length
        self.keys = self._keys[:, :, :length]
        self.values = self._values[:, :, :length]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (increasing), in that order: each moves down to its new place."""
        self.keep_moves(*plan_moves(rows))

    @torch.inference_mode()  # the buffers are inference tensors (forwards run in that mode)
    def keep_moves(self, first: int, moved: torch.Tensor | None, count: int) -> None:
        """`keep` planned by `plan_moves`: rows below `first` stay, `moved` go to first .. count."""
        if not self.is_initialized or self._keys is None or self._values is None:
            return
        if count > self.length or (moved is not None and int(moved[-1]) >= self.length):
            raise ValueError("keep: rows must be increasing cache entries")
        if moved is not None:  # gathered first, then written: a row never overwrites one still to move
            index = moved.to(self._keys.device)
            self._keys[:, :, first:count] = self._keys.index_select(2, index)
            self._values[:, :, first:count] = self._values.index_select(2, index)
        self._show(count)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` rows (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of rows to remove")
        if tokens_to_remove and self.is_initialized:
            self._show(max(self.length + tokens_to_remove, 0))

    def reset(self) -> None:
        super().reset()
        self._keys = self._values = None
        self._arrays = None
        self.length = 0


def session_cache(config: PreTrainedConfig) -> DynamicCache:
    """A `DynamicCache` for `config` whose full-attention layers are `SlabLayer`s (sliding-window
    layers, which drop old rows themselves, are left as transformers makes them)."""
    cache = DynamicCache(config=config)
    cache.layers = [SlabLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def plan_moves(rows: Sequence[int]) -> tuple[int, torch.Tensor | None, int]:
    """What keeping `rows` (increasing cache entries) moves: the count already in place at the
    front, the indices of the rest (None if none) and how many rows remain. Checked once per
    `keep_entries`, not per layer: a session's accept keeps its whole committed prefix, which
    a check per layer walked again for each of a model's layers."""
    if any(b <= a for a, b in zip(rows, rows[1:], strict=False)) or (rows and rows[0] < 0):
        raise ValueError("keep: rows must be increasing cache entries")
    # increasing and non-negative: entry i is in place exactly when rows[i] == i, and once one is
    # not, none after it is; the first misplaced entry is found by bisection
    low, high = 0, len(rows)
    while low < high:
        mid = (low + high) // 2
        if rows[mid] == mid:
            low = mid + 1
        else:
            high = mid
    moved = torch.tensor(list(rows[low:]), dtype=torch.long) if low < len(rows) else None
    return low, moved, len(rows)


def keep_entries(cache: DynamicCache, rows: Sequence[int]) -> None:
    """Keep only the cache entries `rows` (increasing) of every layer, in that order."""
    first, moved, count = plan_moves(rows)
    index: torch.Tensor | None = None
    for layer in cache.layers:
        if isinstance(layer, SlabLayer):
            layer.keep_moves(first, moved, count)
        elif layer.is_initialized and layer.keys is not None and layer.keys.numel():
            if index is None:
                index = torch.tensor(list(rows), dtype=torch.long, device=layer.keys.device)
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
