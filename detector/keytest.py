"""One key's test and the verdict over several keys.

A key's scored positions, their pivots and scores (`key_pivots`, `KeyScorer`, whatever the key's
scheme), its exact p-value, and Holm's correction over the keys tested (`choose_verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.contexts import prefix_positions, scored_positions
from wmark.detector.encoding import Encoding
from wmark.detector.result import Verdict
from wmark.keymaterial import KeyMaterial
from wmark.prf import KeyedSource
from wmark.scoring import ScoreResult, aaronson_scores, log_gamma_sf_many, log_gamma_tail
from wmark.vllm_gumbel import VllmGumbelKey

__all__ = ["KeyPivots", "KeyScore", "KeyScorer", "choose_verdict", "holm_adjust", "key_pivots"]

_THREADED_TOKENS = 4096  # below this many tokens `window_pivots` uses one thread anyway


@dataclass(frozen=True)
class KeyPivots:
    """Scored positions of a sequence under one key, their pivots and scores.

    Attributes:
        positions: (m,) scored positions, ascending.
        pivots: (m,) U(y_t, 1), Unif(0, 1) under H0 (for vLLM's dual-key scheme: the H0 CDF of
            the token's score).
        scores: (m,) each position's share of the test statistic: -ln(1 - pivot), or vLLM's
            weighted dual-key score.
    """

    positions: npt.NDArray[np.int64]
    pivots: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]


def key_pivots(
    token_ids: npt.NDArray[np.uint32], source: KeyedSource, *, start: int = 0, threads: int = 1
) -> KeyPivots:
    """Pivots of every scored position of `token_ids` under one key.

    Args:
        token_ids: (n,) token IDs; with the prompt in front when start > 0.
        source: the key's clocks.
        start: first position that may be scored (the prompt length, or 0 for answer-only text).
        threads: threads for the pivot computation (long texts).
    """
    spec = source.spec
    if spec.context_mode == "prefix":
        positions = prefix_positions(len(token_ids), start)
        pivots = source.prefix_pivots(token_ids.tolist(), start)
    else:
        # one pass in C, unless a long text's pivots are to be split over threads
        one_pass = threads <= 1 or len(token_ids) < _THREADED_TOKENS
        found = source.scored_pivots(token_ids, start) if one_pass else None
        if found is not None:
            positions, pivots = found
        else:
            sp = scored_positions(token_ids, spec.context_width, start)
            positions = sp.positions
            pivots = source.window_pivots(sp.windows, token_ids[sp.positions], threads=threads)
    return KeyPivots(positions, pivots, aaronson_scores(pivots))


class KeyScorer:
    """One key's test, whatever its scheme: scored positions, per-token scores, exact p-value.

    The statistic (the sum of a text's token scores over n scored positions) is
    Gamma(n / v, scale v) under H0: v = 1 for wmark's keys and vLLM's "gumbel" (the Aaronson
    test), and vLLM's moment-matched (1 - alpha)^2 + alpha^2 for its dual-key scheme.
    """

    def __init__(self, key: KeyMaterial) -> None:
        self.key = key
        self._source: KeyedSource | VllmGumbelKey
        if key.spec.is_vllm:
            self._source = VllmGumbelKey(key.secret, key.spec)
            self.variance = self._source.variance
        else:
            self._source = KeyedSource(key.secret, key.spec)
            self.variance = 1.0

    def pivots(self, token_ids: npt.NDArray[np.uint32], *, start: int = 0, threads: int = 1) -> KeyPivots:
        """Scored positions of `token_ids` (prompt in front when start > 0) and their evidence."""
        if isinstance(self._source, KeyedSource):
            return key_pivots(token_ids, self._source, start=start, threads=threads)
        scored = self._source.score(token_ids, start)
        return KeyPivots(scored.positions, scored.pivots, scored.scores)

    def pivots_many(
        self, readings: Sequence[npt.NDArray[np.uint32]], *, start: int = 0, threads: int = 1
    ) -> list[KeyPivots]:
        """`pivots` of each of several token sequences (the readings of one text): in window
        mode one pass in C over all of them, hashing a window that several share once."""
        source = self._source
        one_pass = threads <= 1 or all(len(ids) < _THREADED_TOKENS for ids in readings)
        if len(readings) > 1 and isinstance(source, KeyedSource) and source.spec.context_mode == "window":
            found = source.scored_pivots_many(readings, start) if one_pass else None
            if found is not None:
                return [KeyPivots(positions, pivots, aaronson_scores(pivots)) for positions, pivots in found]
        return [self.pivots(ids, start=start, threads=threads) for ids in readings]

    def test(self, kp: KeyPivots) -> ScoreResult:
        """The exact test of all of `kp`'s scored positions."""
        n, score = len(kp.scores), float(kp.scores.sum())
        return ScoreResult(score, log_gamma_tail(n / self.variance, score / self.variance), n)

    def log_p_many(
        self, n: npt.NDArray[np.int64], scores: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Exact log p-values of many statistics `scores[i]` over `n[i]` positions (windows)."""
        if self.variance == 1.0:
            return log_gamma_sf_many(n, scores)
        v = self.variance
        return np.array(
            [log_gamma_tail(k / v, s / v) for k, s in zip(n.tolist(), scores.tolist(), strict=True)]
        )


def holm_adjust(log_ps: Sequence[float]) -> list[float]:
    """Holm step-down adjusted log p-values, in the input order."""
    m = len(log_ps)
    order = sorted(range(m), key=lambda i: log_ps[i])
    adjusted = [0.0] * m
    running = -math.inf
    for rank, i in enumerate(order):
        running = max(running, min(0.0, math.log(m - rank) + log_ps[i]))
        adjusted[i] = running
    return adjusted


def choose_verdict(
    log_ps: Sequence[float], enough: Sequence[bool], alpha: float
) -> tuple[Verdict, int, list[float]]:
    """The verdict over several keys and the key it reports, from each key's log p-value.

    The p-values are Holm-adjusted over the keys. The key reported is the most significant one
    that both passes alpha and has enough scored tokens; failing that, the most significant one.

    Returns:
        (verdict, index of the reported key, the adjusted log p-values in input order).
    """
    adjusted = holm_adjust(log_ps)
    order = sorted(range(len(adjusted)), key=adjusted.__getitem__)
    detected = [i for i in order if enough[i] and adjusted[i] <= math.log(alpha)]
    if detected:
        return "watermarked", detected[0], adjusted
    return ("not_detected" if any(enough) else "insufficient_evidence"), order[0], adjusted


@dataclass(frozen=True)
class KeyScore:
    """One key's evidence on one input: its scored positions, pivots and exact Aaronson test.

    Attributes:
        key: the key.
        pivots: scored positions and pivots of the reading the test reports.
        test: that reading's exact test; its log p-value is corrected for the readings tried.
        encoding: that reading's tokens (offsets into the submitted text).
        reading: its index among the readings.
        n_readings: the readings tried, the Bonferroni factor in `test.log_p`.
    """

    key: KeyMaterial
    pivots: KeyPivots
    test: ScoreResult
    encoding: Encoding
    reading: int = 0
    n_readings: int = 1

    @property
    def enough(self) -> bool:
        """Whether the key scored at least its spec's `min_scored_tokens` positions."""
        return self.test.n >= self.key.spec.min_scored_tokens
