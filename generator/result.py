"""What a generation returns: tokens, text, per-block lengths, clock bookkeeping and timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GenerationResult", "Timings"]


@dataclass(frozen=True, kw_only=True)
class Timings:
    """Wall-clock seconds spent in each part of generation.

    Attributes:
        draft: drafter forward passes.
        verify: target forward passes.
        bookkeeping: everything else (logits processing, clocks, races, tree building).
        prefill: processing the prompt, both models, before the first block. Speculation
            cannot speed it up (every sampler runs the same target prefill; a model drafter adds
            its own), so it is kept out of `draft` and `verify`, whose per-block costs are what
            the cost model's c and r describe.
    """

    draft: float
    verify: float
    bookkeeping: float
    prefill: float = 0.0

    @property
    def total(self) -> float:
        """All of it."""
        return self.prefill + self.draft + self.verify + self.bookkeeping

    @property
    def decode(self) -> float:
        """All of it but the prefill: the part speculation speeds up."""
        return self.draft + self.verify + self.bookkeeping


@dataclass(frozen=True, kw_only=True)
class GenerationResult:
    """One generation.

    Attributes:
        token_ids: generated token IDs (the prompt excluded).
        text: their decoded text (empty when no tokenizer was given).
        prompt_ids: the prompt's token IDs.
        method: the sampler ("basic-uwm", "pfr", "pfr-nowm", "mpfr", ...).
        key_id: the watermark key, None for unwatermarked methods.
        blocks: tokens emitted by each target forward pass.
        drafted: draft tokens proposed in each block (tree nodes for multi-draft methods).
        masked_positions: generated indices whose window repeated (or had none): unkeyed, unscored.
        diverse_positions: generated indices drawn from the request's unkeyed diversity prefix.
        target_forwards / draft_forwards: forward passes of each model.
        stop_reason: "eos", "length", or "cancelled" (stopped by the caller between blocks).
        timings: where the time went.
    """

    token_ids: tuple[int, ...]
    text: str
    prompt_ids: tuple[int, ...]
    method: str
    key_id: str | None
    blocks: tuple[int, ...]
    drafted: tuple[int, ...]
    masked_positions: tuple[int, ...]
    diverse_positions: tuple[int, ...]
    target_forwards: int
    draft_forwards: int
    stop_reason: str
    timings: Timings

    @property
    def aatps(self) -> float:
        """Average accepted tokens per step: emitted tokens per target forward pass."""
        return len(self.token_ids) / len(self.blocks) if self.blocks else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Emitted tokens per second of generation."""
        total = self.timings.total
        return len(self.token_ids) / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with the derived `aatps` and `tokens_per_s`."""
        data = asdict(self)
        data["aatps"] = self.aatps
        data["tokens_per_s"] = self.tokens_per_s
        data["n_tokens"] = len(self.token_ids)
        return data
