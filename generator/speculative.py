"""One block of watermarked decoding: basic-uwm (one token) and the PFR/MPFR draft tree.

Every emitted token is the target's race winner under its position's clock (ALGORITHMS §2-5):

    y = argmin_v -ln U(v, 1) / P(v | context)

so the output is exactly target-distributed and does not depend on the drafter. The drafter
only proposes: with B drafts it builds a tree level by level, drawing ν(c) tokens at each
context c by MPFR on the *same* clock (ν(root) = B; a child gets the multiplicity of its token
among its parent's draws). Identical draws merge, so a tree holds at most B leaves. The target
verifies the whole tree in one forward pass and walks it from the root while its winner is a
drafted child; the first winner that is not (or EOS) ends the block, and a fully accepted path
earns one more (bonus) token. PFR is the B = 1 case (a chain); `pfr-nowm` runs it on unkeyed
clocks. Drafter temperature and model change block lengths only, never the text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from wmark.generator.backend import Session
from wmark.generator.clocks import ClockKind, ClockPolicy, PathState
from wmark.generator.logits import LogitsConfig, Support, supports
from wmark.race import mpfr_draws, race_winner

__all__ = ["Block", "BlockInputs", "Emission", "autoregressive_block", "tree_block"]


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

    `lookahead` is the tree depth L for this block (already capped by the remaining budget).
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


def _race(policy: ClockPolicy, prefix: Sequence[int], path: PathState | None, dist: Support) -> Emission:
    kind = policy.kind(prefix, path)
    u = policy.uniforms(policy.seed(prefix, kind), dist.ids)[:, 0]
    token = int(dist.ids[race_winner(dist.probs, u)])
    return Emission(token, kind, dist.prob_of(token))


def autoregressive_block(inp: BlockInputs) -> Block:
    """basic-uwm: one target forward, one token."""
    start = time.perf_counter()
    root, _ = inp.target.extend([], [])
    verify = time.perf_counter() - start
    emission = _race(inp.policy, inp.committed, None, supports(root[None], inp.target_logits)[0])
    inp.target.accept([], [emission.token])
    return Block([emission], verify_seconds=verify)


@dataclass
class _Node:
    token: int
    parent: int  # -1: child of the root
    depth: int
    nu: int  # draws to make at the context right after this node
    path: PathState  # the drafter's view of the clock state after this node
    draft_id: int = -1  # id in the drafter session once fed to it
    children: dict[int, int] = field(default_factory=dict)


class _Tree:
    """The draft tree of one block; node indices are also the target session's node ids."""

    def __init__(self, committed: Sequence[int], drafts: int, root_path: PathState) -> None:
        self.committed = committed
        self.nodes: list[_Node] = []
        self.root = _Node(token=-1, parent=-1, depth=0, nu=drafts, path=root_path)

    def node(self, i: int) -> _Node:
        return self.root if i < 0 else self.nodes[i]

    def context(self, i: int) -> list[int]:
        tail = []
        while i >= 0:
            tail.append(self.nodes[i].token)
            i = self.nodes[i].parent
        return [*self.committed, *tail[::-1]]

    def add(self, parent: int, token: int, nu: int, path: PathState) -> None:
        self.nodes.append(_Node(token, parent, self.node(parent).depth + 1, nu, path))
        self.node(parent).children[token] = len(self.nodes) - 1


def _draft(inp: BlockInputs, tree: _Tree) -> float:
    """Grow the tree to depth `lookahead`, one batched drafter forward per level; returns seconds."""
    assert inp.drafter is not None
    seconds, fed = 0.0, 0
    level = [-1]  # contexts whose children are drawn next
    for depth in range(1, inp.lookahead + 1):
        start = time.perf_counter()
        if depth == 1:
            rows, _ = inp.drafter.extend([], [])
            logits = rows[None]
        else:  # feed the previous level's tokens to get the draft distributions after them
            parents = [tree.node(tree.nodes[i].parent).draft_id for i in level]
            _, logits = inp.drafter.extend(parents, [tree.nodes[i].token for i in level])
            for offset, i in enumerate(level):
                tree.nodes[i].draft_id = fed + offset
            fed += len(level)
        seconds += time.perf_counter() - start
        next_level = []
        for ctx, dist in zip(level, supports(logits, inp.draft_logits), strict=True):
            prefix, state = tree.context(ctx), tree.node(ctx).path
            kind = inp.policy.kind(prefix, state)
            u = inp.policy.uniforms(inp.policy.seed(prefix, kind), dist.ids, tree.node(ctx).nu)
            draws = dist.ids[mpfr_draws(dist.probs, u)].tolist()
            for token in dict.fromkeys(draws):  # merge identical draws; keep arrival order
                child_state = inp.policy.extend_path(prefix, state, kind, -math.log2(dist.prob_of(token)))
                tree.add(ctx, token, draws.count(token), child_state)
                if token not in inp.eos:
                    next_level.append(len(tree.nodes) - 1)
        level = next_level
        if not level:
            break
    return seconds


def tree_block(inp: BlockInputs) -> Block:
    """PFR (drafts = 1) or MPFR (drafts = B): draft a tree, verify it in one target forward, walk it."""
    tree = _Tree(inp.committed, inp.drafts, inp.policy.root_path())
    draft_seconds = _draft(inp, tree)

    start = time.perf_counter()
    parents = [n.parent for n in tree.nodes]
    root_logits, node_logits = inp.target.extend(parents, [n.token for n in tree.nodes])
    verify_seconds = time.perf_counter() - start

    rows = torch.cat([root_logits[None], node_logits]) if tree.nodes else root_logits[None]
    dists = supports(rows, inp.target_logits)  # dists[0]: root, dists[i + 1]: after node i
    block = Block(drafted=len(tree.nodes), draft_seconds=draft_seconds, verify_seconds=verify_seconds)
    prefix, state, cur, path = list(inp.committed), inp.policy.root_path(), -1, []
    while True:
        emission = _race(inp.policy, prefix, state, dists[cur + 1])
        block.emitted.append(emission)
        state = inp.policy.extend_path(prefix, state, emission.kind, -math.log2(emission.prob))
        prefix.append(emission.token)
        child = tree.node(cur).children.get(emission.token)
        if child is not None:
            cur = child
            path.append(child)
        if child is None or emission.token in inp.eos or len(block.emitted) >= inp.remaining:
            break
        if tree.node(cur).depth == inp.lookahead:  # whole path accepted: one bonus token
            bonus = _race(inp.policy, prefix, state, dists[cur + 1])
            block.emitted.append(bonus)
            break

    emitted = [e.token for e in block.emitted]
    inp.target.accept(path, emitted[len(path) :])
    fed = [n for n in path if tree.nodes[n].draft_id >= 0]
    assert inp.drafter is not None
    inp.drafter.accept([tree.nodes[n].draft_id for n in fed], emitted[len(fed) :])
    return block
