"""Randomness and the speculative-sampling step shared by the baselines.

Every baseline decides a position from up to three sources:

- the watermark clock of the position (`Site.keyed_seed`, KEYED positions only): the same
  HMAC-SHA256 + Philox uniforms U(v, 1) as PFR, so a DeltaGumbel reweight with key k is exactly
  the keyed race winner of the distribution (docs/algorithms.md §6.1, §6.3);
- fresh randomness (`Site.fresh_seed`): acceptance tests, residual samples, drafts and targets
  at positions that must not carry the key. It is the request's unkeyed source
  (`ClockPolicy.free`, from the request seed) at the label (position, (BASELINE_STREAM, window)),
  a label no generator clock uses (real windows hold token IDs, never BASELINE_STREAM), so it
  is reproducible from `--seed` and independent of the key and of the generator's own unkeyed
  clocks. One seed serves several independent streams through Philox's arrival counter j:
  j = DRAFT (draft sample), RESIDUAL (rejection residual), TARGET (target sample), and the
  acceptance uniform is U(ACCEPT_TOKEN, 1);
- a second key (mse-pseudo only, `wmark.generator.baselines.pseudo`).

Token IDs >= 2^32 - 16 are reserved for these auxiliary labels and counters (no vocabulary comes
near). Samples from a distribution are races (argmin_v -ln U_v / R(v)), which are exact for any
i.i.d. uniforms, keyed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.generator.clocks import ClockKind, ClockPolicy, PathState
from wmark.generator.logits import Support
from wmark.prf import seed_uniforms
from wmark.race import race_winner

__all__ = [
    "ACCEPT_TOKEN",
    "BASELINE_STREAM",
    "DRAFT",
    "RESIDUAL",
    "TARGET",
    "Site",
    "point",
    "probs_at",
    "race",
    "residual",
    "site_at",
    "speculative_step",
]

ACCEPT_TOKEN = 0xFFFFFFFF  # U(ACCEPT_TOKEN, 1) at a seed: the acceptance uniform of that position
BASELINE_STREAM = 0xFFFFFFFE  # label tag of the baselines' fresh randomness
DRAFT, RESIDUAL, TARGET = 1, 2, 3  # arrival indices j of the fresh streams at one seed


@dataclass(frozen=True)
class Site:
    """One position seen by a sampler: its clock kind and the seeds of its randomness.

    Attributes:
        kind: the position's clock kind (KEYED: the watermark applies; anything else: it must not).
        label: the window that keys the position (KEYED positions only).
        keyed_seed: the watermark clock's seed at `label` (KEYED positions only).
        fresh_seed: the request's fresh randomness at this position.
    """

    kind: ClockKind
    label: tuple[int, ...] | None
    keyed_seed: bytes | None
    fresh_seed: bytes


def site_at(policy: ClockPolicy, prefix: Sequence[int], path: PathState | None) -> Site:
    """The site of the position right after `prefix` (committed text + speculative path)."""
    kind = policy.kind(prefix, path)
    window = policy.tracker.window(prefix)
    keyed = kind is ClockKind.KEYED
    return Site(
        kind=kind,
        label=window if keyed else None,
        keyed_seed=policy.seed(prefix, kind) if keyed else None,
        fresh_seed=policy.free.seed(len(prefix), (BASELINE_STREAM, *window)),
    )


def race(seed: bytes, dist: Support, stream: int = 1) -> int:
    """The race winner of `dist` under the uniforms U(v, stream) of `seed` (a sample of `dist`)."""
    return int(dist.ids[race_winner(dist.probs, seed_uniforms(seed, dist.ids, stream))])


def point(token: int) -> Support:
    """The point mass on `token` (a DeltaGumbel-reweighted distribution)."""
    return Support(np.array([token], dtype=np.int64), np.array([1.0]))


def probs_at(dist: Support, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """`dist`'s probabilities of `ids` (0 outside its support), vectorised."""
    order = np.argsort(dist.ids, kind="stable")
    sorted_ids = dist.ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    hit = sorted_ids[pos] == ids
    out: npt.NDArray[np.float64] = np.where(hit, dist.probs[order][pos], 0.0)
    return out


def residual(p: Support, q: Support) -> Support | None:
    """norm((P - Q)_+): where speculative sampling resamples after a rejection (None if P <= Q)."""
    mass = np.maximum(p.probs - probs_at(q, p.ids), 0.0)
    keep = mass > 0
    if not keep.any():
        return None
    return Support(p.ids[keep], mass[keep] / mass[keep].sum())


def speculative_step(
    p: Support, q: Support, token: int, u: float, draw_residual: Callable[[Support], int]
) -> int:
    """One step of speculative sampling (Leviathan et al. / Chen et al.) for a draft `token` ~ Q.

    Accept iff u <= min(1, P(token) / Q(token)); otherwise emit a draw of norm((P - Q)_+). The
    result is distributed as P whenever `token` ~ Q and u ~ Unif(0, 1) independently.

    Args:
        p: target distribution P (possibly reweighted).
        q: the distribution `token` was drawn from.
        token: the draft token.
        u: the acceptance uniform.
        draw_residual: samples the residual distribution.
    """
    if u * q.prob_of(token) <= p.prob_of(token):
        return token
    rest = residual(p, q)
    # subtle: a rejection implies Q(token) > P(token), hence sum (P - Q)_+ >= Q(token) - P(token) > 0;
    # only float rounding of two nearly equal probabilities can leave no mass, and then the
    # rejection itself was rounding: keep the token.
    return token if rest is None else draw_residual(rest)
