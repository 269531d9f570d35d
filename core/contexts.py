"""Which positions of a token sequence are scored: context windows and repeated-window masking.

One definition serves both halves. A position t of a sequence is a *candidate* when its
window (the h previous token IDs) lies inside the sequence and t >= start (start = where the
generated text begins, 0 when the detector sees only the answer). A candidate is *scored*
when no earlier candidate had the same window (dedup v1); otherwise it is *masked*. The
generator keys exactly the scored positions (`ContextTracker`), the detector recomputes the
same set from the final text (`scored_positions`), and tests prove the two agree.

Prefix mode (the paper's labels, `PrefixTracker` / `prefix_positions`): a position's label is
every token before it, prompt included. Two positions never share a label (their prefixes
differ in length), so every position from `start` on is scored and none is masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.prf import first_occurrence

__all__ = [
    "ContextTracker",
    "PrefixTracker",
    "ScoredPositions",
    "prefix_positions",
    "scored_positions",
    "window_matrix",
]


def window_matrix(token_ids: npt.NDArray[np.uint32], h: int) -> npt.NDArray[np.uint32]:
    """Rows t - h for t = h..n-1: the window of each position that has a full window.

    Args:
        token_ids: (n,) token IDs.
        h: context width.

    Returns:
        (max(n - h, 0), h) uint32 view; row i is token_ids[i : i + h], the window of position i + h.
    """
    ids = np.ascontiguousarray(token_ids, dtype=np.uint32)
    if len(ids) <= h:
        return np.empty((0, h), dtype=np.uint32)
    return np.lib.stride_tricks.sliding_window_view(ids, h)[:-1]


@dataclass(frozen=True)
class ScoredPositions:
    """The scored positions of a sequence and their windows.

    Attributes:
        positions: (m,) int64 indices t of scored positions, ascending.
        windows: (m, h) uint32 window of each scored position.
        masked: (k,) int64 candidate positions excluded as repeats.
    """

    positions: npt.NDArray[np.int64]
    windows: npt.NDArray[np.uint32]
    masked: npt.NDArray[np.int64]


def scored_positions(token_ids: npt.NDArray[np.uint32], h: int, start: int = 0) -> ScoredPositions:
    """Scored and masked positions of a sequence under window labels with dedup v1.

    Args:
        token_ids: (n,) token IDs of the text (with the prompt in front when start > 0).
        h: context width.
        start: first position that may be scored (the prompt length, or 0).
    """
    first = max(h, start)
    windows = window_matrix(token_ids, h)[first - h :]
    keep = first_occurrence(windows)
    candidates = np.arange(first, first + len(windows), dtype=np.int64)
    return ScoredPositions(candidates[keep], np.ascontiguousarray(windows[keep]), candidates[~keep])


def prefix_positions(n: int, start: int) -> npt.NDArray[np.int64]:
    """Scored positions of an n-token sequence under prefix labels: start..n-1, all of them."""
    return np.arange(start, max(n, start), dtype=np.int64)


class ContextTracker:
    """The generator's incremental view of `scored_positions` over a growing sequence.

    `label(prefix)` says how the next position is treated: None when it is not a candidate or
    its window repeats (use the unkeyed source), else the window to key it with. `commit`
    records an emitted position. `fork` copies the state for a speculative branch so that a
    rejected draft never leaks into the committed set.
    """

    repeats = True  # two positions may share a label: speculative paths must track theirs

    def __init__(self, h: int, start: int) -> None:
        self.h = h
        self.start = start
        self._seen: set[tuple[int, ...]] = set()

    def window(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The (up to h) token IDs before the next position."""
        return tuple(prefix[-self.h :]) if self.h else ()

    def is_candidate(self, position: int) -> bool:
        """Whether position `position` has a full window and lies in the scored range."""
        return position >= max(self.h, self.start)

    def label(self, prefix: Sequence[int]) -> tuple[int, ...] | None:
        """Window to key the next position with, or None if it must use unkeyed randomness."""
        window = self.window(prefix)
        if not self.is_candidate(len(prefix)) or window in self._seen:
            return None
        return window

    def commit(self, prefix: Sequence[int]) -> None:
        """Record that a token was emitted after `prefix` (its window is now used)."""
        if self.is_candidate(len(prefix)):
            self._seen.add(self.window(prefix))

    def fork(self) -> ContextTracker:
        """An independent copy for a speculative branch."""
        twin = ContextTracker(self.h, self.start)
        twin._seen = set(self._seen)
        return twin


class PrefixTracker:
    """`ContextTracker`'s interface for prefix labels: every position from `start` on is keyed.

    The label of the position after `prefix` is the whole prefix (prompt included), so labels
    never repeat and nothing needs remembering; `prefix_positions` is the detector's side.
    """

    repeats = False

    def __init__(self, start: int) -> None:
        self.start = start

    def window(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The label of the next position: every token before it."""
        return tuple(prefix)

    def is_candidate(self, position: int) -> bool:
        """Whether position `position` lies in the scored range."""
        return position >= self.start

    def label(self, prefix: Sequence[int]) -> tuple[int, ...] | None:
        """The next position's label, or None before `start` (those are never generated)."""
        return self.window(prefix) if self.is_candidate(len(prefix)) else None

    def commit(self, prefix: Sequence[int]) -> None:
        """Nothing to record: a prefix label cannot occur twice."""
