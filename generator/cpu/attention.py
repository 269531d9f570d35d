"""Batch-invariant attention on the CPU: each query row attends to exactly its visible keys.

`rowwise_attention` (registered with transformers as `ATTENTION_NAME` by
`wmark.generator.models.prepare`) and `tree_attention` (called by the lean decoder) run the C
kernel `_tree_attention`, whose result for a row depends on that row's query and keys only (in
cache order, which equals position order along a path), so a tree row and the same context
decoded alone compute identical numbers.

The prompt is the exception: every session fills the cache with the prompt (minus its last
token) in one forward under stock SDPA (`stock_attention`), which is deterministic for the same
input, so all sessions of a prompt start from identical caches without a per-row loop over the
prompt. A drafter runs every forward that way (its `ForwardPlan` has `rows_exact` off): it only
proposes, so its rounding never reaches the text, and one SDPA call per layer is cheaper than
the row loop.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from wmark.generator.cpu import _tree_attention
from wmark.generator.cpu.rowwise import gemm_threads

__all__ = ["ATTENTION_NAME", "rowwise_attention", "stock_attention", "tree_attention", "visible_keys"]

ATTENTION_NAME = "wmark_rowwise"
_STOCK: contextvars.ContextVar[bool] = contextvars.ContextVar("wmark_stock_attention", default=False)


@contextlib.contextmanager
def stock_attention() -> Iterator[None]:
    """Within this block, attention runs as stock SDPA (prompt prefill, drafter forwards)."""
    token = _STOCK.set(True)
    try:
        yield
    finally:
        _STOCK.reset(token)


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,  # noqa: ARG001 - inference only
    **kwargs: Any,  # noqa: ARG001 - the attention interface passes extras we do not use
) -> tuple[torch.Tensor, None]:
    """Attention of each query row over exactly its visible keys (`tree_attention`; stock SDPA
    under `stock_attention`).

    Args:
        module: the attention module (for `num_key_value_groups`).
        query: (1, heads, q, d).
        key, value: (1, kv_heads, kv, d), the whole cache plus the new rows.
        attention_mask: (1, 1, q, kv) additive mask (0 where visible); required.
        scaling: 1/sqrt(d).

    Returns:
        ((1, q, heads, d) attention output, None).
    """
    if attention_mask is None or attention_mask.dim() != 4:
        raise ValueError("rowwise attention needs an explicit 4D mask from the session")
    if _STOCK.get():
        groups = int(getattr(module, "num_key_value_groups", 1))
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        out = nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling
        )
        return out.transpose(1, 2).contiguous(), None
    return tree_attention(query, key, value, visible_keys(attention_mask), scaling), None


_LAST_MASK: list[tuple[torch.Tensor, torch.Tensor]] = []  # (mask, visible) of the last call


def visible_keys(attention_mask: torch.Tensor) -> torch.Tensor:
    """(q, kv) uint8, 1 where the additive 4D mask lets a row see a key. Every layer of a forward
    gets the same mask tensor (each forward builds its own: `HFSession.extend`), so the last
    one's answer is kept and reused while the same tensor comes back."""
    last = _LAST_MASK[0] if _LAST_MASK else None  # one read: another thread may replace it
    if last is not None and last[0] is attention_mask:
        return last[1]
    visible = (attention_mask[0, 0] == 0).to(torch.uint8).contiguous()
    _LAST_MASK[:] = [(attention_mask, visible)]
    return visible


def tree_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Each query row's attention over exactly its visible keys, in cache order (the C kernel of
    `wmark.generator.cpu._tree_attention`): a row's numbers depend on its query and those keys only.
    A large enough call runs its (row, key/value head) units on the GEMM's `gemm_threads()`.

    Args:
        query: (1, heads, q, d) float32 on the CPU (any strides).
        key, value: (1, kv_heads, kv, d), heads a multiple of kv_heads (GQA).
        visible: (q, kv) uint8, nonzero where a row sees a key.
        scaling: the factor of the scores (1/sqrt(d)).

    Returns:
        (1, q, heads, d) float32.
    """
    _, heads, n_query, dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    if query.dtype != torch.float32 or query.device.type != "cpu":
        raise ValueError("rowwise attention runs in float32 on the CPU")
    out = torch.empty(1, n_query, heads, dim)
    keys, values = _heads(key), _heads(value)
    if keys is None or values is None or keys[1] != values[1]:
        keys = values = None
    _tree_attention.attend(
        query[0].contiguous().numpy(),
        key[0].contiguous().numpy() if keys is None else keys[0],
        value[0].contiguous().numpy() if values is None else values[0],
        visible.numpy(),
        out.numpy(),
        heads,
        kv_heads,
        n_query,
        n_keys,
        dim,
        scaling,
        n_keys if keys is None else keys[1],
        gemm_threads(),
    )
    return out


def _heads(states: torch.Tensor) -> tuple[Any, int] | None:
    """(kv_heads, stride, d) buffer holding `states` (1, kv_heads, n, d) as each head's first n
    rows, and the stride, without a copy where `states` is the front of a larger cache
    (`wmark.generator.models.kv_cache`); None where it is laid out otherwise."""
    _, kv_heads, n, dim = states.shape
    if states.stride(-1) != 1 or states.stride(-2) != dim or states.stride(1) % dim:
        return None
    stride = states.stride(1) // dim if kv_heads > 1 else max(n, 1)
    end = (states.storage_offset() + kv_heads * stride * dim) * states.element_size()
    if stride < n or end > states.untyped_storage().nbytes():
        return None
    whole = states.as_strided((kv_heads, stride, dim), (stride * dim, dim, 1))
    return whole.numpy(), stride
