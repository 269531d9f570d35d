"""Forwards over a cache allocated once, in a few fixed shapes: what a GPU replays as CUDA graphs.

On a GPU a decode step is bound by kernel launches, not arithmetic, unless the forward is
recorded once and replayed (`wmark.generator.cuda.graphs`). A replay runs on the memory it was
recorded with, so `StaticStore` gives a model's forwards fixed buffers: the cache
(`FixedCache`, `capacity` rows plus a scratch row per padding row), and per row-count bucket
the token IDs, positions, cache slots and additive mask. A forward of n rows is padded to the
smallest bucket that holds it: the padding rows read token 0 at position 0, write their own
scratch rows and see only those, and their logits are dropped; every row's attention reads the
whole capacity through its mask. Nothing but the buffers' contents changes between calls.

Every step except the replay runs on the CPU too, eagerly, and the suite pins it there: with
batch-invariant kernels (`exact-fp32`) the padded forwards give the same logits, bit for bit, as
the slab path (`SlabStore`); with `pad=False` (each forward its own shapes, the cache still
fixed) they do under any kernels. The GPU-only code is the graph capture.

The store runs transformers' forward (wmark's CPU decoder is not used), for one session at a
time: the cache and the graphs outlive a session (a graph is captured once per store and
bucket), so the model keeps a store per session alive at once and hands a free one to the next
(`HFModel.store`); a session whose store was leased again refuses to run.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from wmark.errors import BackendError
from wmark.generator.cuda.graphs import CudaGraphs
from wmark.generator.models.kv_cache import plan_moves
from wmark.generator.models.session_store import forward_inputs, model_logits, prefill_inputs
from wmark.generator.models.static_cache import FixedCache

if TYPE_CHECKING:
    from wmark.generator.models.hf_session import HFModel

__all__ = ["StaticLease", "StaticPlan", "StaticStore"]


@dataclass(frozen=True)
class StaticPlan:
    """How a model's static-cache forwards run.

    Attributes:
        capacity: cache rows at first, for the text and the nodes of a block (the cache doubles
            when a session outgrows it, and graphs are captured again).
        buckets: the row counts a forward is padded to, ascending; a forward of more rows than
            the last runs unpadded and is never captured. The default sampler's blocks stay under
            10 rows on the built-in prompt sets; 128 covers the cost model's 8 x 8 trees.
        pad: pad forwards to the buckets and let every row read the whole capacity (the fixed
            shapes a graph needs); False: each forward its own shapes (the slab path's numbers
            under any kernels).
        graphs: replay each bucket's forward as a CUDA graph (needs `pad` and a CUDA model).
    """

    capacity: int = 2048
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    pad: bool = True
    graphs: bool = False

    def __post_init__(self) -> None:
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be distinct positive row counts, ascending: {self.buckets}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be positive, got {self.capacity}")
        if self.graphs and not self.pad:
            raise ValueError("CUDA graphs need fixed shapes: graphs=True needs pad=True")


@dataclass
class _Bucket:
    """The fixed input buffers of forwards padded to `rows` rows."""

    rows: int
    ints: torch.Tensor  # (3, rows) int64: token IDs, positions, cache slots
    mask: torch.Tensor  # (1, 1, rows, capacity) additive


class StaticStore:
    """A model's fixed cache, its bucket buffers and graphs (see the module)."""

    def __init__(self, lm: HFModel, plan: StaticPlan) -> None:
        if plan.graphs and lm.device.type != "cuda":
            raise BackendError(f"CUDA graphs need a CUDA model; {lm.name} is on {lm.device}")
        self.lm = lm
        self.plan = plan
        self.text_rows = plan.capacity  # rows for the text and nodes; after them, the scratch rows
        self.scratch = plan.buckets[-1] if plan.pad else 0  # one per padding row
        self.cache = FixedCache.for_config(
            lm.model.config, self.text_rows + self.scratch, lm.model.dtype, lm.device
        )
        self.graphs = CudaGraphs() if plan.graphs else None
        self._buckets: dict[int, _Bucket] = {}
        self._holder: weakref.ref[StaticLease] | None = None

    def lease(self) -> StaticLease:
        """The store for a new session, which takes the cache over (any earlier lease is
        refused from then on)."""
        self.cache.length = 0
        lease = StaticLease(self)
        self._holder = weakref.ref(lease)
        return lease

    def free(self) -> bool:
        """No live session holds the store (its lease was dropped with its session)."""
        return self._holder is None or self._holder() is None

    def holds(self, lease: StaticLease) -> bool:
        return self._holder is not None and self._holder() is lease

    # -- the four operations of `session_store.Store`, for the current lease ------------------

    def prefill(self, ids: Sequence[int]) -> None:
        """The prompt in one eager forward of its own shapes (run once per session: no graph)."""
        count = len(ids)
        self._room(count)
        tokens, mask4d, positions = prefill_inputs(self.lm, ids)
        self.cache.write_index = torch.arange(count, device=self.lm.device)
        self.cache.read_width = count
        with self.lm.plan.running(prefill=True):
            model_logits(self.lm, self.cache, tokens, mask4d, positions, logits_to_keep=1)
        self.cache.length = count

    def forward(
        self, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
    ) -> torch.Tensor:
        count, cached = len(inputs), self.cache.length
        self._room(cached + count)
        rows = next((b for b in self.plan.buckets if b >= count), None) if self.plan.pad else None
        with self.lm.plan.running():
            if rows is None:
                logits = self._exact(inputs, committed, tail, positions)
            else:
                logits = self._padded(self._bucket(rows), inputs, committed, tail, positions)
        self.cache.length = cached + count
        return logits

    def keep(self, rows: Sequence[int]) -> None:
        if len(rows) != self.cache.length:
            self.cache.keep_moves(*plan_moves(rows))

    # -- forwards --------------------------------------------------------------------------

    def _exact(
        self, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
    ) -> torch.Tensor:
        """A forward of its own shapes: n rows read the cache's first cached + n rows."""
        lm, cached, count = self.lm, self.cache.length, len(inputs)
        self.cache.write_index = torch.arange(cached, cached + count, device=lm.device)
        self.cache.read_width = cached + count
        logits = model_logits(lm, self.cache, *forward_inputs(lm, inputs, committed, tail, positions))
        return logits[0].to(torch.float32)

    def _padded(
        self,
        bucket: _Bucket,
        inputs: Sequence[int],
        committed: int,
        tail: torch.Tensor,
        positions: Sequence[int],
    ) -> torch.Tensor:
        """A forward padded to `bucket.rows`, every row reading the whole capacity."""
        count, cached = len(inputs), self.cache.length
        host = torch.zeros(3, bucket.rows, dtype=torch.long)
        host[0, :count] = torch.tensor(list(inputs), dtype=torch.long)
        host[1, :count] = torch.tensor(list(positions), dtype=torch.long)
        host[2, :count] = torch.arange(cached, cached + count)
        host[2, count:] = self.text_rows + torch.arange(count, bucket.rows)
        bucket.ints.copy_(host)
        mask = bucket.mask[0, 0]
        mask.fill_(torch.finfo(mask.dtype).min)
        mask[:count, :committed] = 0
        mask[:count, committed : cached + count].masked_fill_(tail.to(mask.device), 0)
        mask[count:].scatter_(1, bucket.ints[2, count:, None], 0.0)  # padding rows see their own rows
        self.cache.write_index = bucket.ints[2]
        self.cache.read_width = self.cache.capacity

        def run() -> torch.Tensor:
            # a new view of the mask per call: the row kernel caches its reading of a mask by
            # tensor identity (`cpu.attention.visible_keys`), and this buffer's contents change
            return model_logits(
                self.lm, self.cache, bucket.ints[0:1], bucket.mask.view_as(bucket.mask), bucket.ints[1:2]
            )

        if self.graphs is None:
            return run()[0, :count].to(torch.float32)
        output = self.graphs.run(bucket.rows, run)
        return output[0, :count].to(torch.float32, copy=True)  # the next replay overwrites it

    # -- buffers ---------------------------------------------------------------------------

    def _bucket(self, rows: int) -> _Bucket:
        bucket = self._buckets.get(rows)
        if bucket is None:
            device, width = self.lm.device, self.cache.capacity
            with torch.inference_mode():
                bucket = _Bucket(
                    rows,
                    torch.zeros(3, rows, dtype=torch.long, device=device),
                    torch.zeros(1, 1, rows, width, dtype=self.lm.dtype, device=device),
                )
            self._buckets[rows] = bucket
        return bucket

    def _room(self, rows: int) -> None:
        """Make the cache hold `rows` rows of text and nodes (doubling it; graphs recaptured)."""
        if rows <= self.text_rows:
            return
        while self.text_rows < rows:
            self.text_rows *= 2
        self.cache = self.cache.grown(self.text_rows + self.scratch)
        self._buckets.clear()
        if self.graphs is not None:
            self.graphs.clear()


class StaticLease:
    """A session's handle on a `StaticStore`; it refuses to run once another session took the store."""

    def __init__(self, store: StaticStore) -> None:
        self.store = store

    def _held(self) -> StaticStore:
        if not self.store.holds(self):
            raise BackendError(
                f"another session of {self.store.lm.name} took this static cache: "
                "it serves one session at a time"
            )
        return self.store

    def cached(self) -> int:
        return self._held().cache.length

    def prefill(self, ids: Sequence[int]) -> None:
        self._held().prefill(ids)

    def forward(
        self, inputs: Sequence[int], committed: int, tail: torch.Tensor, positions: Sequence[int]
    ) -> torch.Tensor:
        return self._held().forward(inputs, committed, tail, positions)

    def keep(self, rows: Sequence[int]) -> None:
        self._held().keep(rows)
