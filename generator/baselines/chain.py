"""The single-draft speculative block shared by vsps, mws, mse and mse-pseudo.

    draft   x_1..x_L from the drafter, one token per drafter forward (`ChainRule.propose`)
    verify  one target forward over the chain -> P at every drafted context and after the last
    settle  walk the chain: emit what `ChainRule.settle` returns at each position; stop at the
            first position where that is not the draft token (a rejection), at EOS, or at the
            budget; if all L drafts stand, add a bonus token (`ChainRule.bonus`)

A rule sees each position as a `Site` (clock kind and seeds). The drafter computes clock kinds
along its own path (its surprisal drives the diversity budget); the target recomputes them along
the emitted path, exactly as the engine commits them, and the rule's acceptance test compares
the target-side distribution with the distribution the draft was actually drawn from. So a
rule is exact whenever its `settle` is an exact speculative step for that pair.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from wmark.generator.baselines.streams import Site, site_at
from wmark.generator.blocks import Block, BlockInputs, Emission
from wmark.generator.clocks import ClockPolicy
from wmark.generator.logits import Support, supports

__all__ = ["ChainRule", "Proposal", "chain_block"]


@dataclass(frozen=True)
class Proposal:
    """A draft token and the distributions behind it.

    Attributes:
        token: the drafted token.
        q: the drafter's processed distribution Q at its context.
        drawn_from: the distribution `token` is a sample of (a point mass for a keyed draw).
    """

    token: int
    q: Support
    drawn_from: Support


class ChainRule(Protocol):
    """How one single-draft method drafts, settles and adds the bonus token."""

    def propose(self, site: Site, q: Support) -> Proposal:
        """Draw a draft token from the drafter's Q at `site`."""
        ...

    def settle(self, site: Site, p: Support, proposal: Proposal) -> int:
        """The token to emit at `site` (the draft token if it is accepted) given the target's P."""
        ...

    def bonus(self, site: Site, p: Support) -> int:
        """The token to emit after a fully accepted chain."""
        ...


RuleFactory = Callable[[ClockPolicy], ChainRule]


def chain_block(make_rule: RuleFactory) -> Callable[[BlockInputs], Block]:
    """The block function of a single-draft method; `make_rule(policy)` gives its rule."""

    def block(inp: BlockInputs) -> Block:
        rule = make_rule(inp.policy)
        proposals, draft_seconds = _draft(inp, rule)

        start = time.perf_counter()
        root, nodes = inp.target.extend(list(range(-1, len(proposals) - 1)), [d.token for d in proposals])
        verify_seconds = time.perf_counter() - start
        dists = supports(torch.cat([root[None], nodes]), inp.target_logits)  # P at c_1 .. c_{n+1}

        out = Block(drafted=len(proposals), draft_seconds=draft_seconds, verify_seconds=verify_seconds)
        prefix, state, accepted = list(inp.committed), inp.policy.root_path(), 0
        while True:
            site = site_at(inp.policy, prefix, state)
            p = dists[accepted]
            if accepted < len(proposals):
                token = rule.settle(site, p, proposals[accepted])
                stands = token == proposals[accepted].token
            else:  # every draft stood (or none was made): the bonus token
                token, stands = rule.bonus(site, p), False
            emission = Emission(token, site.kind, p.prob_of(token))
            out.emitted.append(emission)
            state = inp.policy.extend_path(prefix, state, site.kind, -math.log2(emission.prob))
            prefix.append(token)
            if not stands or token in inp.eos or len(out.emitted) >= inp.remaining:
                break
            accepted += 1

        emitted = [e.token for e in out.emitted]
        inp.target.accept(list(range(accepted)), emitted[accepted:])
        fed = min(accepted, max(len(proposals) - 1, 0))  # the last draft never went into the drafter
        assert inp.drafter is not None
        inp.drafter.accept(list(range(fed)), emitted[fed:])
        return out

    return block


def _draft(inp: BlockInputs, rule: ChainRule) -> tuple[list[Proposal], float]:
    """Draft up to `lookahead` tokens, one drafter forward each; stops after an EOS draft."""
    assert inp.drafter is not None
    proposals: list[Proposal] = []
    prefix, state, seconds = list(inp.committed), inp.policy.root_path(), 0.0
    for depth in range(inp.lookahead):
        start = time.perf_counter()
        if depth == 0:
            logits, _ = inp.drafter.extend([], [])
        else:  # feed the previous draft (node depth - 1) to get Q after it
            _, rows = inp.drafter.extend([depth - 2], [proposals[-1].token])
            logits = rows[0]
        seconds += time.perf_counter() - start
        q = supports(logits[None], inp.draft_logits)[0]
        site = site_at(inp.policy, prefix, state)
        proposal = rule.propose(site, q)
        proposals.append(proposal)
        state = inp.policy.extend_path(prefix, state, site.kind, -math.log2(q.prob_of(proposal.token)))
        prefix.append(proposal.token)
        if proposal.token in inp.eos:
            break
    return proposals, seconds
