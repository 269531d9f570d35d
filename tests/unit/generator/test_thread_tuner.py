"""ThreadTuner: per bucket of row counts, the thread count whose forwards measured fastest, with
the other one probed now and then. Times are given, not measured, so the choices are exact."""

from __future__ import annotations

import pytest

from wmark.generator.cpu import rowwise
from wmark.generator.cpu.thread_tuner import CLOSE, EXPLORE_RARELY, ThreadTuner


def _probe(tuner: ThreadTuner, bucket: int, seconds: dict[int, float]) -> list[int]:
    """Run the probing phase: each forward the tuner asks for takes `seconds[threads]`."""
    asked = []
    for _ in range(tuner.probes * len(seconds)):
        threads = tuner.choose(bucket, tuple(seconds))
        asked.append(threads)
        tuner.record(bucket, threads, seconds[threads])
    return asked


def test_probes_alternate_then_the_faster_count_runs():
    tuner = ThreadTuner(probes=3, explore_every=8)
    asked = _probe(tuner, 1, {1: 0.017, 2: 0.020})
    assert sorted(asked) == [1, 1, 1, 2, 2, 2]  # every candidate probed `probes` times
    assert [tuner.choose(1, (1, 2)) for _ in range(7)] == [1] * 7
    assert tuner.chosen() == {1: 1}


def test_a_close_loser_is_probed_every_explore_every_and_a_clear_one_rarely():
    close = ThreadTuner(probes=2, explore_every=8)
    _probe(close, 4, {1: 0.100, 2: 0.100 * (1 + CLOSE / 2)})
    picks = [close.choose(4, (1, 2)) for _ in range(32)]
    assert picks.count(2) == 4 and picks[7] == 2  # forwards 8, 16, 24, 32

    clear = ThreadTuner(probes=2, explore_every=8)
    _probe(clear, 4, {1: 0.094, 2: 0.068})
    picks = [clear.choose(4, (1, 2)) for _ in range(EXPLORE_RARELY)]
    assert picks.count(1) == 1 and picks[-1] == 1  # only forward EXPLORE_RARELY


def test_buckets_are_chosen_apart_and_a_probe_can_change_the_choice():
    tuner = ThreadTuner(probes=2, explore_every=4)
    _probe(tuner, 1, {1: 0.017, 2: 0.020})
    _probe(tuner, 8, {1: 0.140, 2: 0.090})
    assert tuner.chosen() == {1: 1, 8: 2}
    for _ in range(4):  # the machine changed: one thread got slow for one-row forwards
        tuner.record(1, 1, 0.030)
    assert tuner.choose(1, (1, 2)) == 2


def test_forward_runs_its_block_on_the_chosen_count_and_times_it(monkeypatch):
    tuner = ThreadTuner(probes=1)
    seen = []
    with rowwise.gemm_threads_for(2):  # the model's planned count
        for _ in range(2):
            with tuner.forward(3):
                seen.append(rowwise.gemm_threads())
        assert rowwise.gemm_threads() == 2  # and the planned count is back
    assert sorted(seen) == [1, 2]  # both candidates probed, inside the block
    assert set(tuner.chosen()) == {4}  # 3 rows fall in the bucket of up to 4


def test_prompts_and_one_thread_machines_are_left_alone(monkeypatch):
    tuner = ThreadTuner()
    with rowwise.gemm_threads_for(2), tuner.forward(200):  # a prompt's prefill: past the last bucket
        assert rowwise.gemm_threads() == 2
    with rowwise.gemm_threads_for(1), tuner.forward(1):
        assert rowwise.gemm_threads() == 1
    assert tuner.chosen() == {}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="probes"):
        ThreadTuner(probes=0)
    with pytest.raises(ValueError, match="explore_every"):
        ThreadTuner(explore_every=1)
