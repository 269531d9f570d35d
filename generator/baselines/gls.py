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
sample of P at the stopping depth, which is biased (docs/algorithms.md §6.6); `list_sampling_block`
takes the stopping rule as a parameter so the tests can show that our exactness test rejects
that variant. Unlike MPFR, the randomness is indexed by draft, not by context, so the text
depends on the drafter (only "conditional" drafter invariance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.generator.blocks import Block, BlockInputs, Emission
from wmark.generator.clocks import ClockPolicy
from wmark.generator.logits import Support
from wmark.generator.sampler_tree import DraftTree, Expand, commit, grow, verify
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


def _expand(inp: BlockInputs, trie: DraftTree[tuple[int, ...]]) -> Expand[tuple[int, ...]]:
    """Each draft through a context extends its own chain; drafts that agree share the child.

    A node's data is the tuple of drafts (1-based) whose chain passes through it.
    """

    def expand(ctx: int, q: Support) -> list[tuple[int, tuple[int, ...]]]:
        drafts = trie.node(ctx).data
        u = list_uniforms(inp.policy, len(trie.context(ctx)), drafts, q.ids)
        tokens = [int(q.ids[race_winner(q.probs, row)]) for row in u]
        return [  # one child per distinct token, in draft order
            (token, tuple(b for b, t in zip(drafts, tokens, strict=True) if t == token))
            for token in dict.fromkeys(tokens)
        ]

    return expand


def list_sampling_block(inp: BlockInputs, *, at_stop: StopRule = emit_winner) -> Block:
    """One block of list sampling with B = `inp.drafts` chains; `at_stop` picks the stopping token."""
    trie: DraftTree[tuple[int, ...]] = DraftTree(inp.committed, tuple(range(1, inp.drafts + 1)))
    draft_seconds = grow(inp, trie, _expand(inp, trie))
    dists, verify_seconds = verify(inp, trie)
    block = Block(drafted=len(trie.nodes), draft_seconds=draft_seconds, verify_seconds=verify_seconds)
    prefix, cur, path = list(inp.committed), -1, []
    while True:
        node, p = trie.node(cur), dists[cur + 1]
        active = np.max(list_uniforms(inp.policy, len(prefix), node.data, p.ids), axis=0)
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

    commit(inp, trie, path, [e.token for e in block.emitted])
    return block


def gls_block(inp: BlockInputs) -> Block:
    """gls: list sampling that emits the target winner at the stopping depth (unbiased)."""
    return list_sampling_block(inp)
