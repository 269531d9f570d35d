"""The contract between the engine and a sampler: what one block gets and what it returns.

A block is one target forward pass: a sampler drafts (or not), verifies, and emits one or more
tokens. Our samplers (`speculative`) and the baselines (`baselines/`) all take `BlockInputs` and
return a `Block`, so the engine runs any of them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from wmark.generator.backend import Session
from wmark.generator.clocks import ClockKind, ClockPolicy
from wmark.generator.logits import LogitsConfig

__all__ = ["Block", "BlockInputs", "Emission"]


@dataclass(frozen=True)
class Emission:
    """One emitted token with its clock kind and its probability under the target."""

    token: int
    kind: ClockKind
    prob: float


@dataclass
class Block:
    """What one target forward pass produced."""

    emitted: list[Emission] = field(default_factory=list)
    drafted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class BlockInputs:
    """Everything a block needs: sessions, committed text, clocks and settings.

    `lookahead` is the tree depth L for this block (already capped by the remaining budget);
    a branch stops early where the drafter's probability of its token is below `draft_confidence`.
    `lookup_lookahead` (if deeper than L) lets branches grow on past L with drafts that cost no
    drafter forward (prompt lookup, `draft_tree.grow`). `min_reach` and `max_rows` price the
    tree's verify rows: a draft joins only if its estimated chance of being reached and accepted
    is at least `min_reach`, and the tree holds at most `max_rows` drafts (0: no cap).
    """

    target: Session
    drafter: Session | None
    committed: Sequence[int]
    remaining: int
    policy: ClockPolicy
    target_logits: LogitsConfig
    draft_logits: LogitsConfig
    eos: frozenset[int]
    lookahead: int = 1
    drafts: int = 1
    draft_confidence: float = 0.0
    lookup_lookahead: int = 0
    min_reach: float = 0.0
    max_rows: int = 0
