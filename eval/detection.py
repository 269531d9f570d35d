"""The detectors of the evaluation: pivots of every text, and mse-pseudo's mixed-pivot test.

Every method is scored with the pivots U1(y_t) = U(y_t, 1) of the watermark key at the scored
positions (docs/algorithms.md §7): that is the detector of the DeltaGumbel family (basic-uwm, mws, mse)
and of PFR/MPFR alike, and the unwatermarked methods (vsps, pfr-nowm, gls) are scored with it as
H0 controls. The positions and pivots are the production detector's own (`wmark.detector.key_pivots`)
with the prompt in front, so they are exactly the positions the generator keyed.

mse-pseudo's detector (He et al. 2026) also reads k2: its pivot U2(y_t) and its acceptance uniform
r_t at the same window. The mixed pivot is U2 where r_t > tau (a rejection was likely there, so
the token is k2's residual winner) and U1 elsewhere. Under H0, U1, U2 and r are independent
uniforms, so the mixed pivots are i.i.d. uniform for any fixed tau and the Gamma test stays
exact. tau is either fixed (0.5, as S1's fixed path) or fitted on a training split of the
watermarked texts and applied to the held-out ones (`cross_validate_tau`; He et al.: grid of
101 values, 50 % split, 10 random splits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from wmark.contexts import scored_positions
from wmark.detector import KeyPivots, key_pivots
from wmark.eval.metrics import log_p_at
from wmark.generator.baselines.pseudo import second_key
from wmark.generator.baselines.streams import ACCEPT_TOKEN
from wmark.prf import KeyedSource

__all__ = [
    "DEFAULT_TAU",
    "acceptance_uniforms",
    "generated_pivots",
    "TextPivots",
    "TauFit",
    "cross_validate_tau",
    "fit_tau",
    "mixed_pivots",
    "text_pivots",
]

DEFAULT_TAU = 0.5
TAU_GRID = np.linspace(0.0, 1.0, 101)


@dataclass(frozen=True)
class TextPivots:
    """Scored positions of one generated text and the pivots there.

    Attributes:
        positions: (n,) generated indices (0 = first generated token) of the scored positions.
        u1: (n,) pivots under the watermark key.
        u2: (n,) pivots under mse-pseudo's second key.
        r: (n,) mse-pseudo's acceptance uniforms.
    """

    positions: npt.NDArray[np.int64]
    u1: npt.NDArray[np.float64]
    u2: npt.NDArray[np.float64]
    r: npt.NDArray[np.float64]


def generated_pivots(prompt_ids: Sequence[int], token_ids: Sequence[int], source: KeyedSource) -> KeyPivots:
    """The detector's pivots of a generated text with its prompt in front (window mode).

    Only the prompt's last h IDs matter. Positions are generated indices (0 = first generated
    token).
    """
    tail = list(prompt_ids)[-source.spec.context_width :]
    kp = key_pivots(np.array([*tail, *token_ids], dtype=np.uint32), source, start=len(tail))
    return replace(kp, positions=kp.positions - len(tail))


def text_pivots(prompt_ids: Sequence[int], token_ids: Sequence[int], source: KeyedSource) -> TextPivots:
    """Pivots of a generated text under the watermark key and mse-pseudo's second key.

    Args:
        prompt_ids: the prompt (or at least its last context_width IDs).
        token_ids: the generated tokens.
        source: the watermark key's clocks (window mode).
    """
    k2 = second_key(source)
    u1 = generated_pivots(prompt_ids, token_ids, source)
    return TextPivots(
        positions=u1.positions,
        u1=u1.pivots,
        u2=generated_pivots(prompt_ids, token_ids, k2).pivots,
        r=acceptance_uniforms(prompt_ids, token_ids, k2),
    )


def acceptance_uniforms(
    prompt_ids: Sequence[int], token_ids: Sequence[int], k2: KeyedSource
) -> npt.NDArray[np.float64]:
    """mse-pseudo's r_t: k2's uniform of its acceptance token at each scored position's window."""
    h = k2.spec.context_width
    tail = list(prompt_ids)[-h:]
    ids = np.array([*tail, *token_ids], dtype=np.uint32)
    sp = scored_positions(ids, h, start=len(tail))
    return k2.window_pivots(sp.windows, np.full(len(sp.positions), ACCEPT_TOKEN, dtype=np.uint32))


def mixed_pivots(
    u1: npt.ArrayLike, u2: npt.ArrayLike, r: npt.ArrayLike, tau: float
) -> npt.NDArray[np.float64]:
    """mse-pseudo's pivots: U2 where r > tau, else U1."""
    out: npt.NDArray[np.float64] = np.where(np.asarray(r) > tau, np.asarray(u2), np.asarray(u1))
    return out


@dataclass(frozen=True)
class TauFit:
    """tau fitted on training splits and the held-out detection rate.

    Attributes:
        taus: the tau chosen on each split's training half.
        tpr: held-out detection rate of each split.
    """

    taus: tuple[float, ...]
    tpr: tuple[float, ...]


def fit_tau(texts: Sequence[TextPivots], tokens: int, alpha: float) -> float:
    """The tau of `TAU_GRID` that detects most of `texts` at `tokens` tokens (ties: more total evidence)."""
    best, best_key = DEFAULT_TAU, (-1, -math.inf)
    for tau in TAU_GRID:
        log_ps = [log_p_at(t.positions, mixed_pivots(t.u1, t.u2, t.r, tau), tokens)[0] for t in texts]
        key = (sum(lp <= math.log(alpha) for lp in log_ps), -sum(log_ps))
        if key > best_key:
            best, best_key = float(tau), key
    return best


def cross_validate_tau(
    texts: Sequence[TextPivots], tokens: int, alpha: float, *, splits: int = 10, seed: int = 0
) -> TauFit:
    """Fit tau on a random half of the watermarked texts, measure detection on the other half.

    Needs at least 2 texts. tau is chosen without looking at the held-out texts, so their
    p-values keep their H0 law (any fixed tau gives uniform mixed pivots under H0).
    """
    if len(texts) < 2:
        raise ValueError("fitting tau needs at least two texts")
    rng = np.random.default_rng(seed)
    taus, tprs = [], []
    for _ in range(splits):
        order = rng.permutation(len(texts))
        train, test = order[: len(texts) // 2], order[len(texts) // 2 :]
        tau = fit_tau([texts[i] for i in train], tokens, alpha)
        hits = [
            log_p_at(texts[i].positions, mixed_pivots(texts[i].u1, texts[i].u2, texts[i].r, tau), tokens)[0]
            <= math.log(alpha)
            for i in test
        ]
        taus.append(tau)
        tprs.append(sum(hits) / len(hits))
    return TauFit(tuple(taus), tuple(tprs))
