"""The draft tree of one speculative block: grown level by level, verified in one target forward.

Shared by MPFR (`speculative.tree_block`) and list sampling (`baselines.gls`); they differ only in
how a context's children are drawn (`Expand`) and in how the target walks the verified tree.
Node indices are also the target session's node ids; a node fed to the drafter records its id
there, so that after the walk both sessions keep exactly the accepted path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from wmark.generator.backend import LookupSession, TrustedSession
from wmark.generator.blocks import BlockInputs
from wmark.generator.logits import Support, supports

__all__ = ["DraftTree", "Expand", "Node", "commit", "grow", "verify"]

T = TypeVar("T")


@dataclass
class Node(Generic[T]):
    token: int
    parent: int  # -1: child of the root
    depth: int
    data: T  # what the sampler keeps per node (draw counts, clock state, draft indices)
    draft_id: int = -1  # id in the drafter session once fed to it
    children: dict[int, int] = field(default_factory=dict)


class DraftTree(Generic[T]):
    """Drafted tokens after the committed text; node -1 is the root (the committed text itself)."""

    def __init__(self, committed: Sequence[int], root: T) -> None:
        self.committed = committed
        self.nodes: list[Node[T]] = []
        self.root: Node[T] = Node(token=-1, parent=-1, depth=0, data=root)

    def node(self, i: int) -> Node[T]:
        return self.root if i < 0 else self.nodes[i]

    def context(self, i: int) -> list[int]:
        """The committed text followed by the tokens on the path to node i."""
        tail = []
        while i >= 0:
            tail.append(self.nodes[i].token)
            i = self.nodes[i].parent
        return [*self.committed, *tail[::-1]]

    def add(self, parent: int, token: int, data: T) -> int:
        self.nodes.append(Node(token, parent, self.node(parent).depth + 1, data))
        self.node(parent).children[token] = len(self.nodes) - 1
        return len(self.nodes) - 1


Expand = Callable[[int, Support], Iterable[tuple[int, T]]]
"""expand(ctx, q): the children to add under node ctx, as (token, data) in order, given the
drafter's distribution q after it. Tokens must be distinct."""


def grow(inp: BlockInputs, tree: DraftTree[T], expand: Expand[T]) -> float:
    """Grow the tree to depth `lookahead`, one batched drafter forward per level; returns seconds.

    Children that are EOS end their branch (nothing is drafted after them), and so do children the
    drafter gave less than `draft_confidence` (dynamic lookahead: an unlikely draft is rarely
    accepted, so drafting after it mostly wastes drafter forwards and verify rows). A level is
    only run while some branch is still open.

    Past depth L, down to `lookup_lookahead`, a drafter that can propose without a forward
    (`LookupSession`: prompt lookup) goes on where the text still matches: such drafts cost
    only their verify rows, and a long match (a summary copying its article, code repeating a
    line) is usually accepted far beyond L.

    Each verify row adds to the target forward's cost (BENCHMARKS.md, "Kernels"), so drafts
    are priced: a
    draft's reach (the product along its path of the drafter's probability of each token,
    times its row's `TrustedSession.row_trust` for lookup rows) estimates the chance the target
    walks to it and accepts it. Below `min_reach` it is not drafted, and a level adds the
    likeliest drafts first while the tree holds fewer than `max_rows`.
    """
    assert inp.drafter is not None
    seconds, fed = 0.0, 0
    level = [-1]  # contexts whose children are drawn next
    reach = {-1: 1.0}  # per node: estimated chance the target reaches and accepts it
    lookup = inp.drafter if isinstance(inp.drafter, LookupSession) else None
    trusted = inp.drafter if isinstance(inp.drafter, TrustedSession) else None
    deepest = max(inp.lookahead, inp.lookup_lookahead) if lookup is not None else inp.lookahead
    for depth in range(1, deepest + 1):
        start = time.perf_counter()
        if depth == 1:
            rows, _ = inp.drafter.extend([], [])
            logits = rows[None]
        else:  # feed the previous level's tokens to get the draft distributions after them
            parents = [tree.node(tree.nodes[i].parent).draft_id for i in level]
            tokens = [tree.nodes[i].token for i in level]
            if depth > inp.lookahead and lookup is not None:
                _, logits = lookup.extend_lookup(parents, tokens)
            else:
                _, logits = inp.drafter.extend(parents, tokens)
            for offset, i in enumerate(level):
                tree.nodes[i].draft_id = fed + offset
            fed += len(level)
        seconds += time.perf_counter() - start
        trust = None  # row_trust covers the answer's root row, then its node rows
        if trusted is not None:
            trust = trusted.row_trust()[:1] if depth == 1 else trusted.row_trust()[1:]
        candidates = []
        for k, (ctx, q) in enumerate(zip(level, supports(logits, inp.draft_logits), strict=True)):
            if not q.ids.size:  # the drafter has nothing to propose here (prompt lookup found no match)
                continue
            factor = reach[ctx] * (trust[k] if trust is not None else 1.0)
            for token, data in expand(ctx, q):
                prob = q.prob_of(token)
                if factor * prob >= inp.min_reach:
                    candidates.append((factor * prob, prob, ctx, token, data))
        if inp.max_rows:
            candidates.sort(key=lambda c: -c[0])  # stable: equal reaches keep drawing order
            candidates = candidates[: max(inp.max_rows - len(tree.nodes), 0)]
        next_level = []
        for chance, prob, ctx, token, data in candidates:
            child = tree.add(ctx, token, data)
            reach[child] = chance
            if token not in inp.eos and prob >= inp.draft_confidence:
                next_level.append(child)
        level = next_level
        if not level:
            break
    return seconds


def verify(inp: BlockInputs, tree: DraftTree[T]) -> tuple[list[Support], float]:
    """One target forward over the whole tree; returns (dists, seconds).

    dists[0] is the target's distribution at the root, dists[i + 1] the one after node i.
    """
    start = time.perf_counter()
    root, nodes = inp.target.extend([n.parent for n in tree.nodes], [n.token for n in tree.nodes])
    seconds = time.perf_counter() - start
    rows = torch.cat([root[None], nodes]) if tree.nodes else root[None]
    return supports(rows, inp.target_logits), seconds


def commit(inp: BlockInputs, tree: DraftTree[T], path: Sequence[int], emitted: Sequence[int]) -> None:
    """Keep the accepted path (node ids) in both sessions and append the emitted tokens beyond it."""
    inp.target.accept(list(path), list(emitted[len(path) :]))
    fed = [n for n in path if tree.nodes[n].draft_id >= 0]
    assert inp.drafter is not None
    inp.drafter.accept([tree.nodes[n].draft_id for n in fed], list(emitted[len(fed) :]))
