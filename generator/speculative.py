"""One block of watermarked decoding: basic-uwm (one token) and the PFR/MPFR draft tree.

Every emitted token is the target's race winner under its position's clock (docs/algorithms.md §2-5):

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
from dataclasses import dataclass

from wmark.generator.blocks import Block, BlockInputs, Emission
from wmark.generator.clocks import ClockPolicy, PathState
from wmark.generator.logits import Support, supports
from wmark.generator.sampler_tree import DraftTree, Expand, commit, grow, verify
from wmark.race import mpfr_draws, race_winner

__all__ = ["autoregressive_block", "race", "tree_block"]


def race(policy: ClockPolicy, prefix: Sequence[int], path: PathState | None, dist: Support) -> Emission:
    """The race winner at the position after `prefix` (+ path), under the clock the policy picks."""
    kind = policy.kind(prefix, path)
    u = policy.uniforms(policy.seed(prefix, kind), dist.ids)[:, 0]
    token = int(dist.ids[race_winner(dist.probs, u)])
    return Emission(token, kind, dist.prob_of(token))


def autoregressive_block(inp: BlockInputs) -> Block:
    """basic-uwm: one target forward, one token."""
    start = time.perf_counter()
    root, _ = inp.target.extend([], [])
    verify = time.perf_counter() - start
    emission = race(inp.policy, inp.committed, None, supports(root[None], inp.target_logits)[0])
    inp.target.accept([], [emission.token])
    return Block([emission], verify_seconds=verify)


@dataclass(frozen=True)
class _Draws:
    """Per tree node: the draws to make at the context right after it, and the drafter's view
    of the clock state there."""

    nu: int
    path: PathState


def _expand(inp: BlockInputs, tree: DraftTree[_Draws]) -> Expand[_Draws]:
    """MPFR children of a context: ν draws on its own clock, identical draws merged (arrival order)."""

    def expand(ctx: int, dist: Support) -> list[tuple[int, _Draws]]:
        prefix, here = tree.context(ctx), tree.node(ctx).data
        kind = inp.policy.kind(prefix, here.path)
        u = inp.policy.uniforms(inp.policy.seed(prefix, kind), dist.ids, here.nu)
        draws = dist.ids[mpfr_draws(dist.probs, u)].tolist()
        children = []
        for token in dict.fromkeys(draws):  # merge identical draws; keep arrival order
            state = inp.policy.extend_path(prefix, here.path, kind, -math.log2(dist.prob_of(token)))
            children.append((token, _Draws(draws.count(token), state)))
        return children

    return expand


def tree_block(inp: BlockInputs) -> Block:
    """PFR (drafts = 1) or MPFR (drafts = B): draft a tree, verify it in one target forward, walk it."""
    tree = DraftTree(inp.committed, _Draws(inp.drafts, inp.policy.root_path()))
    draft_seconds = grow(inp, tree, _expand(inp, tree))
    dists, verify_seconds = verify(inp, tree)
    block = Block(drafted=len(tree.nodes), draft_seconds=draft_seconds, verify_seconds=verify_seconds)
    prefix, state, cur, path = list(inp.committed), inp.policy.root_path(), -1, []
    while True:
        emission = race(inp.policy, prefix, state, dists[cur + 1])
        block.emitted.append(emission)
        state = inp.policy.extend_path(prefix, state, emission.kind, -math.log2(emission.prob))
        prefix.append(emission.token)
        child = tree.node(cur).children.get(emission.token)
        if child is not None:
            cur = child
            path.append(child)
        # At a leaf (a whole branch accepted) the next race has no drafted child: the bonus token.
        if child is None or emission.token in inp.eos or len(block.emitted) >= inp.remaining:
            break
    commit(inp, tree, path, [e.token for e in block.emitted])
    return block
