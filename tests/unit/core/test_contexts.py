"""Scored positions: the generator's incremental tracker and the detector's batch view agree."""

from __future__ import annotations

import numpy as np
import pytest

from wmark.contexts import ContextTracker, PrefixTracker, prefix_positions, scored_positions, window_matrix


def _tracker_masks(ids: list[int], h: int, start: int) -> tuple[list[int], list[int]]:
    tracker = ContextTracker(h, start)
    scored, masked = [], []
    for t in range(start, len(ids)):
        prefix = ids[:t]
        if tracker.label(prefix) is not None:
            scored.append(t)
        elif tracker.is_candidate(t):
            masked.append(t)
        tracker.commit(prefix)
    return scored, masked


@pytest.mark.parametrize("h", [1, 2, 4])
@pytest.mark.parametrize("start", [0, 3, 9])
def test_tracker_and_batch_view_agree(h, start):
    rng = np.random.default_rng(h * 100 + start)
    for _ in range(50):
        ids = rng.integers(0, 3, size=int(rng.integers(1, 60))).tolist()  # tiny vocab: many repeats
        sp = scored_positions(np.array(ids, dtype=np.uint32), h, start)
        scored, masked = _tracker_masks(ids, h, start)
        assert sp.positions.tolist() == scored
        assert sp.masked.tolist() == masked
        for t, w in zip(sp.positions.tolist(), sp.windows.tolist(), strict=True):
            assert w == ids[t - h : t]


def test_repeated_window_is_scored_once():
    ids = np.array([5, 6, 7, 8, 9, 5, 6, 7, 8, 9], dtype=np.uint32)
    sp = scored_positions(ids, 4, 0)
    # window (5,6,7,8) first predicts 9 at t=4 and again at t=9: only t=4 is scored.
    assert sp.positions.tolist() == [4, 5, 6, 7, 8]
    assert sp.masked.tolist() == [9]


def test_fork_does_not_leak_into_parent():
    tracker = ContextTracker(2, 0)
    tracker.commit([1, 2])
    branch = tracker.fork()
    branch.commit([3, 4])
    assert branch.label([3, 4]) is None
    assert tracker.label([3, 4]) == (3, 4)


def test_short_sequences_have_no_windows():
    assert window_matrix(np.array([1, 2], dtype=np.uint32), 4).shape == (0, 4)
    assert scored_positions(np.array([1, 2, 3, 4], dtype=np.uint32), 4).positions.size == 0


@pytest.mark.parametrize("start", [0, 3, 9])
def test_prefix_tracker_keys_every_position_the_detector_scores(start):
    rng = np.random.default_rng(start)
    ids = rng.integers(0, 3, size=40).tolist()  # repeated windows: masked in window mode, not here
    tracker = PrefixTracker(start)
    keyed = []
    for t in range(len(ids)):
        label = tracker.label(ids[:t])
        if label is not None:
            assert label == tuple(ids[:t])  # the whole prefix, prompt included
            keyed.append(t)
        tracker.commit(ids[:t])
    assert keyed == prefix_positions(len(ids), start).tolist() == list(range(start, len(ids)))
    assert prefix_positions(2, 5).size == 0
