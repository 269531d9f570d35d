"""A KV cache allocated once and written at slots the caller names: the fixed shapes a CUDA graph needs.

A CUDA graph replays kernels on the memory they were captured with, so nothing a captured
forward touches may move or change shape between calls: not the cache (transformers'
`DynamicCache` concatenates, wmark's `SlabLayer` doubles its buffers), not the index of the rows
a forward writes, not the number of keys its attention reads. `FixedCache` keeps every layer's
keys and values in one buffer (1, kv_heads, capacity, dim) each, zeroed once; a forward writes
its rows at the positions held in the tensor `write_index` (contents set before each call, the
tensor itself fixed) and its attention reads the first `read_width` rows, where a mask says
which of them each query sees. Unused rows are zeros or old finite values, always masked, so
they add exact zeros to a softmax.

`wmark.generator.models.static_forward` drives it: the slots, the widths and the masks.
Accepting a path moves rows on the device, as the slab cache does, for all layers at once.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache, DynamicLayer

from wmark.errors import BackendError

__all__ = ["FixedCache", "FixedLayer"]


class FixedLayer(DynamicLayer):  # type: ignore[misc]  # transformers is untyped here (pyproject)
    """One layer's keys and values in buffers of the cache's capacity (see the module)."""

    def __init__(self, cache: FixedCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.cache = cache
        self.buffers = (keys, values)  # views of the cache's one storage
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.keys, self.values = keys, values

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        *args: Any,  # noqa: ARG002 - transformers passes cache kwargs we do not use
        **kwargs: Any,  # noqa: ARG002
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows (1, kv_heads, n, dim) at `cache.write_index`; return the first
        `cache.read_width` rows of the buffers (views: no copy)."""
        keys, values = self.buffers
        index = self.cache.write_index
        keys.index_copy_(2, index, key_states.to(keys.dtype))
        values.index_copy_(2, index, value_states.to(values.dtype))
        width = self.cache.read_width
        return keys[:, :, :width], values[:, :, :width]

    def get_seq_length(self) -> int:
        return self.cache.length


class FixedCache(Cache):  # type: ignore[misc]
    """Keys and values of every layer of a model with full attention, `capacity` rows each.

    Attributes:
        capacity: rows per layer.
        length: rows that hold the session's text and nodes (the caller keeps it).
        write_index: (n,) int64 on the device, the rows the next forward writes, in input order.
        read_width: how many rows (from the front) the next forward's attention reads.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.capacity = int(capacity)
        self.length = 0
        self.write_index = torch.zeros(0, dtype=torch.long, device=device)
        self.read_width = 0
        # every layer's keys and values in one storage (layer, keys|values, 1, kv_heads, rows,
        # dim): accepting a path moves the rows of all layers in one gather and one copy (on a
        # GPU, two kernels instead of four per layer)
        with torch.inference_mode():  # like every tensor a forward writes
            self.storage = torch.zeros(
                (int(layers), 2, 1, int(kv_heads), self.capacity, int(head_dim)), dtype=dtype, device=device
            )
        super().__init__(
            layers=[FixedLayer(self, self.storage[i, 0], self.storage[i, 1]) for i in range(int(layers))]
        )

    @classmethod
    def for_config(
        cls, config: PreTrainedConfig, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> FixedCache:
        """A cache for a transformers model's `config`.

        Raises:
            BackendError: the model has layers other than full attention (sliding windows).
        """
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise BackendError(
                f"the static KV cache serves full-attention layers only; this model has {sorted(types)}"
            )
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_key_value_heads, head_dim, capacity, dtype, device)

    @torch.inference_mode()
    def keep_moves(self, first: int, moved: torch.Tensor | None, count: int) -> None:
        """Keep rows planned by `kv_cache.plan_moves`: those below `first` stay, `moved` go to
        first .. count (gathered first, then written), in every layer at once, on the device."""
        if count > self.length or (moved is not None and int(moved[-1]) >= self.length):
            raise ValueError("keep: rows must be increasing cache entries")
        if moved is not None:
            self.storage[..., first:count, :] = self.storage.index_select(4, moved.to(self.storage.device))
        self.length = count

    @torch.inference_mode()
    def grown(self, capacity: int) -> FixedCache:
        """A cache of `capacity` rows holding this one's first `length` rows (new buffers: a
        graph captured on the old ones must be captured again)."""
        layers, _, _, kv_heads, _, head_dim = self.storage.shape
        bigger = FixedCache(layers, kv_heads, head_dim, capacity, self.storage.dtype, self.storage.device)
        bigger.storage[..., : self.length, :] = self.storage[..., : self.length, :]
        bigger.length = self.length
        return bigger
