"""mse-pseudo (He et al. 2026, Algorithm 1 with the Gumbel-max reweight; docs/algorithms.md §6.5).

MSE whose acceptance test and residual are keyed by a second key k2 instead of fresh noise:

- draft: the keyed (k1) race winner of Q, as in `mse`;
- acceptance at a keyed position: r = U2(ACCEPT_TOKEN, 1) <= min(1, P(x)/Q(x)), where U2 are the
  uniforms of k2's clock at the same window;
- rejection: the k2 race winner of norm((P - Q)_+) (uniforms U2(v, 1));
- bonus: the k1 race winner of P.

k2 is derived from k1 through k1's own keyed PRF at a reserved label (h + 1 copies of 2^32 - 1,
longer than any window, made of an ID no vocabulary has), so the detector holding k1 holds k2
and nothing else can recompute it. Unlike He et al., who apply k2 at every position, positions
that must not carry the key fall back to `mse`'s fresh acceptance: a repeated window is never
scored, and keying it again would reuse k2's randomness at a window already used; the diversity
prefix is unkeyed by design. r uses a counter of its own, so it is independent of the
residual's uniforms (He et al.'s code reads both from the same draw).

Detection (`wmark.eval.detection`) mixes the two pivots: U2(y) where r > tau (a rejection
was likely, the token is k2's residual winner), else U1(y).
"""

from __future__ import annotations

from wmark.generator.baselines.chain import Proposal, chain_block
from wmark.generator.baselines.reweight import MaintainEfficiency
from wmark.generator.baselines.streams import ACCEPT_TOKEN, Site, race, speculative_step
from wmark.generator.clocks import ClockPolicy
from wmark.generator.logits import Support
from wmark.prf import KeyedSource, seed_uniforms
from wmark.secret import Secret

__all__ = ["PseudoRandomAcceptance", "acceptance_uniform", "mse_pseudo_block", "second_key"]

_RESERVED_ID = 0xFFFFFFFF


def second_key(source: KeyedSource) -> KeyedSource:
    """k2's clocks, derived from k1's (`source`) at a reserved label; same spec."""
    label = (_RESERVED_ID,) * (source.spec.context_width + 1)
    return KeyedSource(Secret(source.seed(label)), source.spec)


def acceptance_uniform(seed: bytes) -> float:
    """r at a position whose k2 seed is `seed`."""
    return float(seed_uniforms(seed, ACCEPT_TOKEN, 1))


class PseudoRandomAcceptance(MaintainEfficiency):
    """mse-pseudo's rule for one request (k2 comes from the request's key)."""

    def __init__(self, k2: KeyedSource) -> None:
        self.k2 = k2

    def settle(self, site: Site, p: Support, proposal: Proposal) -> int:
        """k2-keyed acceptance and residual at keyed positions, `mse`'s fresh ones elsewhere."""
        if site.label is None:
            return super().settle(site, p, proposal)
        seed = self.k2.seed(site.label)
        return speculative_step(
            p, proposal.q, proposal.token, acceptance_uniform(seed), lambda rest: race(seed, rest)
        )


def _rule(policy: ClockPolicy) -> PseudoRandomAcceptance:
    if policy.keyed is None:
        raise ValueError("mse-pseudo needs a watermark key")
    return PseudoRandomAcceptance(second_key(policy.keyed))


mse_pseudo_block = chain_block(_rule)
