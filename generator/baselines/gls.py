"""gls: Rowan et al.'s Gumbel-max list sampling (their "Invariant" multi-draft decoder), unbiased.

Common randomness U[p, b, v], indexed by absolute position p, draft index b = 1..B and token v
(no key): the request's unkeyed source at the label (p, (GLS_STREAM,)), arrival counter j = b.

    draft   B independent chains: draft b at position p emits argmin_v -ln U[p, b, v] / Q(v | its
            prefix). Chains sharing a prefix share its drafter row, so the drafts form a trie
            (one batched drafter forward per depth).
    verify  one target forward over the trie; walk it from the root with the active set A (the
            drafts that agree with everything emitted so far, initially all B):
                Y = argmin_v min_{b in A} -ln U[p, b, v] / P(v | prefix)
            emit Y; if some active draft has Y here, keep only those drafts and go on, else stop.
            After L accepted tokens, one more Y from the same rule is the bonus.

Given A, min_{b in A} -ln U[p, b, v] are i.i.d. Exp(|A|) over v, so Y ~ P whatever A is: the
output is exactly target-distributed. Rowan et al.'s published code instead emits a *fresh*
sample of P at the stopping depth, which is biased (ALGORITHMS §6.6); `list_sampling_block`
takes the stopping rule as a parameter so the tests can show that our exactness test rejects
that variant. Unlike MPFR, the randomness is indexed by draft, not by context, so the text
depends on the drafter (only "conditional" drafter invariance).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from wmark.generator.clocks import ClockPolicy
from wmark.generator.logits import Support, supports
from wmark.generator.speculative import Block, BlockInputs, Emission
from wmark.prf import seed_uniforms
from wmark.race import race_winner

__all__ = ["GLS_STREAM", "ListStop", "gls_block", "list_sampling_block"]

GLS_STREAM = 0xFFFFFFFD  # label tag of the list randomness (no real window contains it)


@dataclass(frozen=True)
class ListStop:
    """Where the walk stops: no active draft holds the target's winner.

    Attributes:
        policy: the request's clocks (its unkeyed source, for rules that want fresh noise).
        prefix: committed text + emitted tokens before the stopping position.
        p: the target's distribution there.
        winner: Y, the active drafts' target winner (what the unbiased rule emits).
    """

    policy: ClockPolicy
    prefix: Sequence[int]
    p: Support
    winner: int


StopRule = Callable[[ListStop], int]


def emit_winner(stop: ListStop) -> int:
    """The unbiased stopping rule: emit the target winner Y itself."""
    return stop.winner


def list_uniforms(
    policy: ClockPolicy, position: int, drafts: Sequence[int], ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """U[position, b, v] for b in `drafts` (1-based) and v in `ids`: (len(drafts), len(ids))."""
    seed = policy.free.seed(position, (GLS_STREAM,))
    return seed_uniforms(seed, ids[None, :], np.asarray(drafts)[:, None])


@dataclass
class _Node:
    token: int
    parent: int  # -1: child of the root
    depth: int
    drafts: tuple[int, ...]  # the drafts whose chain passes through this node
    draft_id: int = -1  # id in the drafter session once fed to it
    children: dict[int, int] = field(default_factory=dict)


class _Trie:
    """The B draft chains merged on common prefixes; node indices are the target's node ids."""

    def __init__(self, committed: Sequence[int], drafts: int) -> None:
        self.committed = committed
        self.nodes: list[_Node] = []
        self.root = _Node(-1, -1, 0, tuple(range(1, drafts + 1)))

    def node(self, i: int) -> _Node:
        return self.root if i < 0 else self.nodes[i]

    def context(self, i: int) -> list[int]:
        tail = []
        while i >= 0:
            tail.append(self.nodes[i].token)
            i = self.nodes[i].parent
        return [*self.committed, *tail[::-1]]

    def add(self, parent: int, token: int, drafts: tuple[int, ...]) -> int:
        self.nodes.append(_Node(token, parent, self.node(parent).depth + 1, drafts))
        self.node(parent).children[token] = len(self.nodes) - 1
        return len(self.nodes) - 1


def _draft(inp: BlockInputs, trie: _Trie) -> float:
    """Grow the B chains to depth `lookahead`, one batched drafter forward per depth."""
    assert inp.drafter is not None
    seconds, fed, level = 0.0, 0, [-1]
    for depth in range(1, inp.lookahead + 1):
        start = time.perf_counter()
        if depth == 1:
            root, _ = inp.drafter.extend([], [])
            logits = root[None]
        else:
            parents = [trie.node(trie.nodes[i].parent).draft_id for i in level]
            _, logits = inp.drafter.extend(parents, [trie.nodes[i].token for i in level])
            for offset, i in enumerate(level):
                trie.nodes[i].draft_id = fed + offset
            fed += len(level)
        seconds += time.perf_counter() - start
        next_level = []
        for ctx, q in zip(level, supports(logits, inp.draft_logits), strict=True):
            node = trie.node(ctx)
            u = list_uniforms(inp.policy, len(trie.context(ctx)), node.drafts, q.ids)
            tokens = [int(q.ids[race_winner(q.probs, row)]) for row in u]
            for token in dict.fromkeys(tokens):  # one child per distinct token, in draft order
                holders = tuple(b for b, t in zip(node.drafts, tokens, strict=True) if t == token)
                child = trie.add(ctx, token, holders)
                if token not in inp.eos:
                    next_level.append(child)
        level = next_level
        if not level:
            break
    return seconds


def list_sampling_block(inp: BlockInputs, *, at_stop: StopRule = emit_winner) -> Block:
    """One block of list sampling with B = `inp.drafts` chains; `at_stop` picks the stopping token."""
    trie = _Trie(inp.committed, inp.drafts)
    draft_seconds = _draft(inp, trie)

    start = time.perf_counter()
    root, nodes = inp.target.extend([n.parent for n in trie.nodes], [n.token for n in trie.nodes])
    verify_seconds = time.perf_counter() - start
    rows = torch.cat([root[None], nodes]) if trie.nodes else root[None]
    dists = supports(rows, inp.target_logits)  # dists[0]: root, dists[i + 1]: after node i

    block = Block(drafted=len(trie.nodes), draft_seconds=draft_seconds, verify_seconds=verify_seconds)
    prefix, cur, path = list(inp.committed), -1, []
    while True:
        node, p = trie.node(cur), dists[cur + 1]
        active = np.max(list_uniforms(inp.policy, len(prefix), node.drafts, p.ids), axis=0)
        token = int(p.ids[race_winner(p.probs, active)])  # min_b E[p, b, v] = -ln max_b U[p, b, v]
        child = node.children.get(token)
        if child is None and node.depth < inp.lookahead:
            token = at_stop(ListStop(inp.policy, tuple(prefix), p, token))
        block.emitted.append(Emission(token, inp.policy.kind(prefix), p.prob_of(token)))
        prefix.append(token)
        if child is None or token in inp.eos or len(block.emitted) >= inp.remaining:
            break
        cur = child
        path.append(child)

    emitted = [e.token for e in block.emitted]
    inp.target.accept(path, emitted[len(path) :])
    fed = [n for n in path if trie.nodes[n].draft_id >= 0]
    assert inp.drafter is not None
    inp.drafter.accept([trie.nodes[n].draft_id for n in fed], emitted[len(fed) :])
    return block


def gls_block(inp: BlockInputs) -> Block:
    """gls: list sampling that emits the target winner at the stopping depth (unbiased)."""
    return list_sampling_block(inp)
