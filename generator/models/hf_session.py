"""Hugging Face causal LMs behind the backend protocol: KV cache, tree attention, rollback.

Only the public forward is used: `model(input_ids, cache=..., attention_mask=4D, position_ids=...)`
(`past_key_values=` before transformers 5.25), or wmark's own layer loop where the model's
`ForwardPlan` says so (`wmark.generator.models.forward_plan`).
A session keeps the committed text in a KV cache (the prompt enters it in one prefill forward
before the first block): its own, growing in place, or the model's, allocated once for fixed
shapes and CUDA graphs (`wmark.generator.models.session_store`); speculative nodes are
appended after it and see, through a 4D mask, the committed text plus their own ancestors, at
position (committed length + depth - 1). `accept` keeps the committed entries and moves the
accepted path's entries behind them in every layer (a crop cannot drop side branches). So a whole
MPFR draft tree is one forward, and a rejected draft costs no recomputation.

The model comes prepared for its precision (`wmark.generator.models.prepare`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from wmark.generator.backend import NodeTable
from wmark.generator.cpu.attention import ATTENTION_NAME
from wmark.generator.models.forward_plan import ForwardPlan
from wmark.generator.models.session_store import SlabStore, Store
from wmark.generator.models.static_forward import StaticPlan, StaticStore

__all__ = ["HFModel", "HFSession"]


class HFSession:
    """A generation's view of one model; see `wmark.generator.backend.Session`."""

    def __init__(self, lm: HFModel, prompt_ids: Sequence[int]) -> None:
        self.lm = lm
        self.store: Store = lm.store()
        self.committed = 0  # cache entries that hold committed text
        self.pending: list[int] = [int(t) for t in prompt_ids]
        self.nodes = NodeTable()
        self.slots: list[int] = []  # cache index of each node
        self.node_logits: list[torch.Tensor] = []
        self.root_logits: torch.Tensor | None = None
        self.forwards = 0  # forwards that produced logits (the prompt prefill is not one)
        self.prefilled = False

    def prefill(self) -> None:
        """See `backend.PrefillSession`."""
        if not self.prefilled:
            self._prefill()

    @torch.inference_mode()
    def _prefill(self) -> None:
        """Cache all prompt tokens but the last in one forward (identical for every session)."""
        self.prefilled = True
        head = self.pending[:-1]
        if not head:
            return
        self.store.prefill(head)
        self.committed = len(head)
        self.pending = self.pending[-1:]

    @torch.inference_mode()
    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """See `Session.extend`."""
        if not self.prefilled:
            self._prefill()
        new = self.nodes.add(parents, tokens)
        inputs = self.pending + [int(t) for t in tokens]
        if not inputs:
            if self.root_logits is None:
                raise RuntimeError("no root logits yet: the session has nothing to process")
            return self.root_logits, torch.empty(0, self.lm.vocab_size)
        n_pending = len(self.pending)
        cached = self.store.cached()
        if n_pending and cached != self.committed:
            raise RuntimeError("pending tokens with speculative nodes in the cache: accept() first")
        # which rows after the committed text each input row sees (`session_store`)
        tail = torch.zeros(len(inputs), cached + len(inputs) - self.committed, dtype=torch.bool)
        positions = []
        for row in range(n_pending):  # queued committed tokens: causal among themselves
            tail[row, : row + 1] = True
            positions.append(self.committed + row)
        for k, node in enumerate(new):  # nodes: committed text + their ancestors + themselves
            row = n_pending + k
            self.slots.append(cached + row)
            tail[row, :n_pending] = True
            tail[row, [self.slots[a] - self.committed for a in self.nodes.ancestors(node)]] = True
            positions.append(self.committed + n_pending + self.nodes.depths[node] - 1)
        logits = self.store.forward(inputs, self.committed, tail, positions)
        self.forwards += 1
        if n_pending:
            self.root_logits = logits[n_pending - 1]
            self.committed += n_pending
            self.pending = []
        node_logits = logits[n_pending:]
        self.node_logits.extend(node_logits)
        assert self.root_logits is not None
        return self.root_logits, node_logits

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """See `Session.accept`."""
        self.nodes.check_path(path)
        keep = list(range(self.committed)) + [self.slots[n] for n in path]
        self.store.keep(keep)
        self.committed = len(keep)
        if path and not extra:
            self.root_logits = self.node_logits[path[-1]]
        elif extra:
            self.root_logits = None
        self.pending = [int(t) for t in extra]
        self.nodes.clear()
        self.slots.clear()
        self.node_logits.clear()


class HFModel:
    """A loaded causal LM (plus what the samplers need to know about it).

    Args:
        model: a transformers causal LM, already prepared (`wmark.generator.models.prepare`).
        eos_token_ids: tokens that end generation.
        name: for messages.
        tokenizer_sha256: SHA-256 of its tokenizer.json, when known: keys bound to another
            tokenizer are refused by `generate`.
        gemm_threads: threads of the CPU kernels per call (the thread plan's; None: torch's).
        static: run sessions on a cache allocated once, in fixed shapes, replayable as CUDA
            graphs (`wmark.generator.models.static_forward`); None: each session's own cache
            that grows in place, each forward its own shapes (`session_store.SlabStore`).

    `plan`: how its sessions' forwards run (`ForwardPlan`); a target's plan unless replaced
    (`wmark.generator.drafters.build.build_drafter` gives a draft model a drafter's).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: frozenset[int],
        name: str = "model",
        *,
        tokenizer_sha256: str | None = None,
        gemm_threads: int | None = None,
        static: StaticPlan | None = None,
    ) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.name = name
        self.tokenizer_sha256 = tokenizer_sha256
        self.vocab_size = int(model.config.vocab_size)
        self.device = (
            next(model.parameters()).device if any(True for _ in model.parameters()) else torch.device("cpu")
        )
        self.dtype = torch.float32 if model.config._attn_implementation == ATTENTION_NAME else model.dtype
        self.plan = ForwardPlan.target(model, gemm_threads)
        self.static = static
        # one per session alive at once, kept for reuse; the first made now (a model the static
        # path cannot serve is refused here, and its cache allocated before the first request)
        self.static_stores: list[StaticStore] = [] if static is None else [StaticStore(self, static)]

    def store(self) -> Store:
        """Where a new session keeps its cache: its own slab, or a static store of the model's
        that no live session holds (a new one where all are held: a model drafting for itself
        runs two sessions at once). A static store keeps its cache and graphs between sessions."""
        if self.static is None:
            return SlabStore(self)
        free = next((store for store in self.static_stores if store.free()), None)
        if free is None:
            free = StaticStore(self, self.static)
            self.static_stores.append(free)
        return free.lease()

    def session(self, prompt_ids: Sequence[int]) -> HFSession:
        """See `LanguageModel.session`."""
        return HFSession(self, prompt_ids)
