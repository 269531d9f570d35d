"""vsps, mse and mws: plain speculative sampling and Hu & Huang's two reweighted variants.

- `vsps` (Leviathan et al. 2023, Chen et al. 2023; docs/algorithms.md §6.2): drafts ~ Q, accept x with
  probability min(1, P(x)/Q(x)), else resample norm((P - Q)_+); a bonus token ~ P after a fully
  accepted chain. All fresh randomness, no watermark. Acceptance per position is 1 - TV(P, Q).
- `mse`, "maintain sampling efficiency" (Hu & Huang 2024, §6.4): the drafter emits the keyed race
  winner of Q (DeltaGumbel-reweighted Q), the acceptance test and the residual use the
  unwatermarked P and Q with fresh randomness, the bonus is the keyed race winner of P. Over
  keys the draft is ~ Q, so the output is exact and acceptance stays 1 - TV(P, Q); rejected
  positions carry no watermark.
- `mws`, "maintain watermark strength" (§6.3): both models are reweighted with the same key,
  and speculative sampling runs between the reweighted P~ and Q~. At a keyed position both are
  point masses, so the draft stands iff the two keyed winners agree and the residual is the
  target's winner: exactly PFR's race coupling (docs/algorithms.md §3), hence the same text as `pfr`
  at keyed positions.

At positions that must not carry the key (repeated windows, the diversity prefix) the
reweight is the identity ("skipped" in Hu & Huang): these methods fall back to vsps there.
"""

from __future__ import annotations

from collections.abc import Callable

from wmark.generator.baselines.chain import Proposal, chain_block
from wmark.generator.baselines.streams import (
    ACCEPT_TOKEN,
    DRAFT,
    RESIDUAL,
    TARGET,
    Site,
    point,
    race,
    speculative_step,
)
from wmark.generator.clocks import ClockPolicy
from wmark.generator.logits import Support
from wmark.prf import seed_uniforms

__all__ = [
    "MaintainEfficiency",
    "MaintainStrength",
    "SpeculativeSampling",
    "mse_block",
    "mws_block",
    "vsps_block",
]


class SpeculativeSampling:
    """vsps: every draw from fresh randomness."""

    def propose(self, site: Site, q: Support) -> Proposal:
        """A fresh draw from Q."""
        return Proposal(race(site.fresh_seed, q, DRAFT), q, q)

    def settle(self, site: Site, p: Support, proposal: Proposal) -> int:
        """Speculative sampling between P and Q with a fresh acceptance uniform and residual."""
        return self._step(site, p, proposal.q, proposal.token)

    def bonus(self, site: Site, p: Support) -> int:
        """A fresh draw from P."""
        return race(site.fresh_seed, p, TARGET)

    @staticmethod
    def _step(site: Site, p: Support, q: Support, token: int) -> int:
        u = float(seed_uniforms(site.fresh_seed, ACCEPT_TOKEN, 1))
        return speculative_step(p, q, token, u, lambda rest: race(site.fresh_seed, rest, RESIDUAL))


class MaintainEfficiency(SpeculativeSampling):
    """mse: keyed drafts and bonus; unwatermarked acceptance test and residual."""

    def propose(self, site: Site, q: Support) -> Proposal:
        """The keyed race winner of Q at keyed positions (a point mass), else a fresh draw."""
        if site.keyed_seed is None:
            return super().propose(site, q)
        token = race(site.keyed_seed, q)
        return Proposal(token, q, point(token))

    def bonus(self, site: Site, p: Support) -> int:
        """The keyed race winner of P at keyed positions, else a fresh draw."""
        return race(site.keyed_seed, p) if site.keyed_seed is not None else super().bonus(site, p)


class MaintainStrength(MaintainEfficiency):
    """mws: speculative sampling between the reweighted P~ and Q~."""

    def settle(self, site: Site, p: Support, proposal: Proposal) -> int:
        """Accept iff u <= P~(x)/Q~(x); at a keyed position: iff the keyed winners of P and Q agree."""
        p_tilde = point(race(site.keyed_seed, p)) if site.keyed_seed is not None else p
        return self._step(site, p_tilde, proposal.drawn_from, proposal.token)


def _fixed(rule: SpeculativeSampling) -> Callable[[ClockPolicy], SpeculativeSampling]:
    return lambda _policy: rule


vsps_block = chain_block(_fixed(SpeculativeSampling()))
mse_block = chain_block(_fixed(MaintainEfficiency()))
mws_block = chain_block(_fixed(MaintainStrength()))
