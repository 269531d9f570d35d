"""Which clock a position uses, and its uniforms: the generator's half of the spec contract.

Every emitted token is the race winner of the target distribution under its position's clock.
The clock is keyed (the watermark) unless the position must not carry the key:

- *masked*: its window already occurred at an earlier scored position of this text (or it has
  no full window), exactly the positions the detector drops (`wmark.contexts`);
- *diverse*: the request's diversity prefix, drawn from unkeyed randomness until the tokens
  drawn that way carry `diversity_bits` bits of surprisal under the target. The prefix then
  has probability <= 2^-diversity_bits, so two requests with the same prompt draw the same one
  (and so the same answer) with probability <= 2^-diversity_bits, unless the whole answer
  carries fewer bits. The detector scores these positions (it cannot know them): they add
  noise, not bias, and cost their number in effective scored tokens (BENCHMARKS.md);
- every position of `pfr-nowm`, the unwatermarked control.

A prefix-mode key (the paper's labels) keys every position after the prompt with the whole
prefix, prompt included (`PrefixTracker`): nothing is masked, the diversity prefix works as
above, and the detector needs the prompt's token IDs in front of the answer.

Unkeyed clocks come from the request's nonce (`FreeSource`): shared by drafter and target at
the same context, so speculation stays exact, and reproducible from `--seed`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

from wmark.contexts import ContextTracker, PrefixTracker
from wmark.keymaterial import KeyMaterial
from wmark.prf import FreeSource, KeyedSource, seed_uniforms

__all__ = ["ClockKind", "ClockPolicy", "PathState"]


class ClockKind(Enum):
    """Why a position uses the clock it uses."""

    KEYED = "keyed"
    MASKED = "masked"
    DIVERSE = "diverse"
    UNKEYED = "unkeyed"  # pfr-nowm


# Draws from the request's own randomness: their surprisal counts towards the diversity budget.
_UNKEYED_DRAWS = frozenset({ClockKind.MASKED, ClockKind.DIVERSE})


@dataclass(frozen=True)
class PathState:
    """What the clock choice depends on besides the committed text: a speculative path.

    Attributes:
        windows: windows of the path's own positions (they count as seen for later positions).
        diversity_spent: surprisal (bits) of diversity positions emitted so far, path included.
    """

    windows: frozenset[tuple[int, ...]] = frozenset()
    diversity_spent: float = 0.0


class ClockPolicy:
    """Chooses each position's clock and derives its uniforms U(v, j).

    Args:
        key: the watermark key, or None for the unkeyed control (`pfr-nowm`).
        nonce: the request's unkeyed randomness (from `--seed`, else random).
        prompt_len: number of prompt tokens (positions before it are never generated).
        diversity_bits: surprisal budget of the unkeyed diversity prefix (0 disables it).
        context_width: h; only used when there is no key (the spec's value otherwise).
        spec_version: labels the free source; the key's spec version when there is a key.
    """

    def __init__(
        self,
        key: KeyMaterial | None,
        nonce: bytes,
        *,
        prompt_len: int,
        diversity_bits: float = 0.0,
        context_width: int = 4,
        spec_version: int = 1,
    ) -> None:
        self.keyed = KeyedSource(key.secret, key.spec) if key is not None else None
        self.h = key.spec.context_width if key is not None else context_width
        version = key.spec.spec_version if key is not None else spec_version
        self.free = FreeSource(nonce, version)
        self.tracker: ContextTracker | PrefixTracker = (
            PrefixTracker(prompt_len)
            if key is not None and key.spec.context_mode == "prefix"
            else ContextTracker(self.h, prompt_len)
        )
        self.diversity_bits = diversity_bits
        self.diversity_spent = 0.0

    def kind(self, prefix: Sequence[int], path: PathState | None = None) -> ClockKind:
        """The clock kind of the position right after `prefix` (committed text + path)."""
        if self.keyed is None:
            return ClockKind.UNKEYED
        window = self.tracker.window(prefix)
        if self.tracker.label(prefix) is None or (path is not None and window in path.windows):
            return ClockKind.MASKED  # exactly the positions the detector drops
        spent = path.diversity_spent if path is not None else self.diversity_spent
        return ClockKind.DIVERSE if spent < self.diversity_bits else ClockKind.KEYED

    def seed(self, prefix: Sequence[int], kind: ClockKind) -> bytes:
        """The clock seed of the position right after `prefix`."""
        if kind is ClockKind.KEYED:
            assert self.keyed is not None
            return self.keyed.seed(self.tracker.window(prefix))
        # The unkeyed source is labelled by (position, last h IDs) in both context modes.
        return self.free.seed(len(prefix), tuple(prefix[-self.h :]))

    @staticmethod
    def uniforms(seed: bytes, ids: npt.NDArray[np.int64], arrivals: int = 1) -> npt.NDArray[np.float64]:
        """U(v, j) for v in `ids` and j = 1..arrivals: (len(ids), arrivals)."""
        return seed_uniforms(seed, ids[:, None], np.arange(1, arrivals + 1)[None, :])

    def extend_path(
        self, prefix: Sequence[int], path: PathState, kind: ClockKind, surprisal_bits: float
    ) -> PathState:
        """The path state after emitting a token at the position right after `prefix`."""
        windows = path.windows
        if self.tracker.repeats and self.tracker.is_candidate(len(prefix)):
            windows = windows | {self.tracker.window(prefix)}
        spent = path.diversity_spent + (surprisal_bits if kind in _UNKEYED_DRAWS else 0.0)
        return PathState(windows, spent)

    def root_path(self) -> PathState:
        """The empty path at the committed prefix."""
        return PathState(frozenset(), self.diversity_spent)

    def commit(self, prefix: Sequence[int], kind: ClockKind, prob: float) -> None:
        """Record an emitted token at the position right after `prefix` (with its target probability)."""
        self.tracker.commit(prefix)
        if kind in _UNKEYED_DRAWS:
            self.diversity_spent += -math.log2(prob)
