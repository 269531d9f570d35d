"""Where a session's keys and values live and how its forwards run.

`HFSession` keeps a generation's bookkeeping (nodes, their cache slots, the committed text, the
queued tokens) and asks a store for four things: how many rows the cache holds, a prefill of
the prompt, one forward over new rows, and which rows to keep after a block. Two stores:

- `SlabStore` (here): the cache grows in place (`wmark.generator.models.kv_cache`) and each
  forward has its own shapes; the CPU path, and any device's default.
- `StaticStore` (`wmark.generator.models.static_forward`): a cache allocated once and forwards
  padded to a few fixed shapes, which a GPU can replay as CUDA graphs.

A forward's rows are the queued committed tokens first, then the new nodes. Every row sees the
whole committed text, so a store is told its length (`committed`) and, for the rows after it,
a (rows, width) boolean `tail`: which of the cache rows committed .. committed + width - 1 each
new row sees (the queued tokens causally, a node its ancestors and itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from wmark.generator.models.kv_cache import keep_entries, session_cache

if TYPE_CHECKING:
    from wmark.generator.models.hf_session import HFModel

__all__ = ["SlabStore", "Store", "additive_mask", "forward_inputs", "model_logits", "prefill_inputs"]


class Store(Protocol):
    """What `HFSession` needs of the cache it writes (see the module)."""

    def cached(self) -> int:
        """Rows in the cache: the committed text plus the nodes of unaccepted blocks."""
        ...

    def prefill(self, ids: Sequence[int]) -> None:
        """Cache the prompt's tokens `ids` (all but its last) in one causal forward."""
        ...

    def forward(
        self, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
    ) -> torch.Tensor:
        """Run `inputs` after the cached rows; (len(inputs), vocab) float32 logits."""
        ...

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only the cache rows `rows` (increasing), in that order."""
        ...


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of a boolean `visible`: 0 where a row sees a key, the
    dtype's most negative number elsewhere (exp of it is an exact 0 in a softmax)."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)


def prefill_inputs(lm: HFModel, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, n) token IDs, (1, 1, n, n) causal mask and (1, n) positions of a prompt prefill of
    `ids`, on `lm`'s device."""
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    return (
        torch.tensor([list(ids)], device=lm.device),
        additive_mask(causal, lm.dtype)[None, None].to(lm.device),
        torch.arange(len(ids), device=lm.device)[None],
    )


def forward_inputs(
    lm: HFModel, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, n) token IDs, (1, 1, n, cached + n) mask and (1, n) positions of a forward of its own
    shapes over `inputs` (every row sees the `committed` rows, then its `tail`), on `lm`'s device."""
    visible = torch.cat([torch.ones(len(inputs), committed, dtype=torch.bool), tail], dim=1)
    return (
        torch.tensor([list(inputs)], device=lm.device),
        additive_mask(visible, lm.dtype)[None, None].to(lm.device),
        torch.tensor([list(positions)], device=lm.device),
    )


def model_logits(
    lm: HFModel,
    cache: object,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """(1, n, vocab) logits of transformers' forward of `lm` over `cache` (passed under the
    keyword the installed version takes), the cache extended by the new rows; `logits_to_keep`:
    only the last rows' logits (0: all)."""
    out = lm.model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **{lm.plan.cache_keyword: cache},
    )
    logits: torch.Tensor = out.logits
    return logits


class SlabStore:
    """A session's own cache that grows in place; each forward runs its exact shapes."""

    def __init__(self, lm: HFModel) -> None:
        self.lm = lm
        self.cache = session_cache(lm.model.config)

    def cached(self) -> int:
        return int(self.cache.get_seq_length())

    def prefill(self, ids: Sequence[int]) -> None:
        lm, plan = self.lm, self.lm.plan
        tokens, mask4d, positions = prefill_inputs(lm, ids)
        with plan.running(prefill=True):
            if plan.decoder is not None:
                plan.decoder.prefill(tokens, mask4d, positions, self.cache)
            else:
                model_logits(lm, self.cache, tokens, mask4d, positions, logits_to_keep=1)

    def forward(
        self, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
    ) -> torch.Tensor:
        lm, plan = self.lm, self.lm.plan
        ids, mask4d, position_ids = forward_inputs(lm, inputs, committed, tail, positions)
        with plan.running():
            if plan.decoder is not None:
                out = plan.decoder(ids, mask4d, position_ids, self.cache)
            else:
                out = model_logits(lm, self.cache, ids, mask4d, position_ids)
        return out[0].to(torch.float32)

    def keep(self, rows: Sequence[int]) -> None:
        if len(rows) != self.cached():
            keep_entries(self.cache, rows)
