"""The backend protocol: next-token logits for a committed prefix plus a tree of speculative tokens.

A `Session` holds one model's view of one generation. The committed text is cached (KV cache);
speculative tokens form a tree of *nodes* hanging off the end of it. `extend` adds nodes and
returns the logits at the root (the position right after the committed text) and after each new
node, in one forward pass: a chain of drafts, a whole MPFR draft tree, or nothing (just the
root). `accept` keeps one root-to-node path, drops every other node (cache rollback) and
appends tokens the model has not seen yet. Samplers speak only this protocol, so tests can run
them on fakes and tiny random models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

__all__ = ["LanguageModel", "LookupSession", "NodeTable", "PrefillSession", "Session", "TrustedSession"]


class Session(Protocol):
    """One model's incremental view of one generation."""

    forwards: int  # model forward passes run so far

    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Add speculative nodes and return logits in one forward pass.

        Args:
            parents: for each new node, the id of its parent node (ids number all nodes added since
                the last `accept`, in order, from 0) or -1 for a child of the root. Parents come
                before children.
            tokens: the token of each new node.

        Returns:
            (root_logits (V,), node_logits (n, V)): logits at the root and after each new node.
        """
        ...

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """Commit the nodes on `path` (a root-to-node chain of ids), drop the rest, then queue `extra`."""
        ...


@runtime_checkable
class PrefillSession(Protocol):
    """A session whose prompt processing can run on its own, before the first `extend`.

    `generate` runs it first and reports its seconds apart (`Timings.prefill`): prefill is
    compute-bound and the same for every sampler, so speculation cannot speed it up, and left
    inside the first block it would inflate the drafter's and the verify's per-block cost.
    """

    def prefill(self) -> None:
        """Process the prompt now (else the first `extend` does); a no-op once done."""
        ...


@runtime_checkable
class LookupSession(Protocol):
    """A session that can also propose without a forward pass (prompt lookup)."""

    def extend_lookup(
        self, parents: Sequence[int], tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`Session.extend` that never runs a model: a node without a lookup match gets an all -inf row."""
        ...


@runtime_checkable
class TrustedSession(Protocol):
    """A drafter session whose rows are not all equally good proposals (prompt lookup's)."""

    def row_trust(self) -> list[float]:
        """Per row of the last `extend` / `extend_lookup` answer (root first, then each new node):
        the chance a draft from that row is accepted, relative to what its probabilities say
        (1.0 for a model's row). `draft_tree.grow` prices verify rows with it."""
        ...


class LanguageModel(Protocol):
    """A causal language model the samplers can drive."""

    vocab_size: int
    eos_token_ids: frozenset[int]
    # SHA-256 of the tokenizer.json whose IDs the model reads; None when unknown (raw IDs only).
    # `generate` refuses a key bound to another tokenizer.
    tokenizer_sha256: str | None

    def session(self, prompt_ids: Sequence[int]) -> Session:
        """A new session whose committed text is the prompt (processed on the first `extend`)."""
        ...


@dataclass
class NodeTable:
    """Bookkeeping a session needs about its speculative nodes (shared by the implementations)."""

    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def add(self, parents: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """Append nodes (validating parents) and return their ids."""
        if len(parents) != len(tokens):
            raise ValueError("parents and tokens must have the same length")
        ids = []
        for parent, token in zip(parents, tokens, strict=True):
            if not -1 <= parent < len(self.parents):
                raise ValueError(f"parent {parent} does not exist yet")
            self.parents.append(parent)
            self.tokens.append(int(token))
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
            ids.append(len(self.parents) - 1)
        return ids

    def ancestors(self, node: int) -> list[int]:
        """Node ids from the root's child down to `node` (inclusive)."""
        chain = []
        while node >= 0:
            chain.append(node)
            node = self.parents[node]
        return chain[::-1]

    def check_path(self, path: Sequence[int]) -> None:
        """Raise unless `path` is a chain from the root."""
        for i, node in enumerate(path):
            if not 0 <= node < len(self.parents) or self.parents[node] != (path[i - 1] if i else -1):
                raise ValueError(f"path {list(path)} is not a root-to-node chain")

    def clear(self) -> None:
        """Forget every node."""
        self.parents.clear()
        self.tokens.clear()
        self.depths.clear()
