"""Thread plan from the free cores: measured from /proc/stat, overridden by WMARK_THREADS."""

from __future__ import annotations

import os

import pytest

from wmark.generator import settings
from wmark.generator.cpu import threads as cpu_threads


def _stat(*cpus: tuple[int, int]) -> str:
    """A /proc/stat with the given (busy, idle) jiffies per CPU."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i, (busy, idle) in enumerate(cpus)]
    return "\n".join([*lines, "intr 0", ""])


@pytest.fixture()
def two_cores(tmp_path, monkeypatch):
    """Two CPUs whose /proc/stat moves by the given jiffies while free_cores sleeps."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(cpu_threads, "_STAT", stat)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.delenv(settings.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    totals = [(1000, 5000), (2000, 4000)]  # counters since boot: only their growth matters
    stat.write_text(_stat(*totals))

    def advance(*deltas: tuple[int, int]) -> None:
        def sleep(_seconds: float) -> None:
            totals[:] = [(b + db, i + di) for (b, i), (db, di) in zip(totals, deltas, strict=True)]
            stat.write_text(_stat(*totals))

        monkeypatch.setattr(cpu_threads.time, "sleep", sleep)

    return advance


Plan = cpu_threads.ThreadPlan


def test_one_busy_core_leaves_torch_one_thread_and_the_gemm_a_sleeping_second(two_cores):
    two_cores((100, 0), (3, 97))  # cpu0 spinning, cpu1 idle
    assert cpu_threads.free_cores() == pytest.approx(0.97)
    # the caller is left the idle cpu1: the GEMM's worker runs beside the spinner on cpu0
    assert cpu_threads.plan_threads() == Plan(1, 2, "passive", frozenset({0}))
    two_cores((3, 97), (100, 0))
    assert cpu_threads.plan_threads() == Plan(1, 2, "passive", frozenset({1}))


def test_a_quiet_machine_gets_every_core_and_a_loaded_one_still_gets_a_thread(two_cores):
    two_cores((10, 90), (20, 80))
    assert cpu_threads.plan_threads() == Plan(2, 2, "active")  # workers anywhere
    two_cores((100, 0), (100, 0))
    assert cpu_threads.plan_threads() == Plan(1, 2, "passive", frozenset({1}))  # a tie: cpu0 kept


def test_an_explicit_count_or_the_environment_wins(two_cores, monkeypatch):
    two_cores((100, 0), (100, 0))
    assert cpu_threads.plan_threads(3) == Plan(3, 3, "active")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cpu_threads.plan_threads() == Plan(4, 4, "active")
    monkeypatch.setenv(settings.THREADS_ENV, "2")  # wmark's own variable first
    assert cpu_threads.plan_threads() == Plan(2, 2, "active")
    monkeypatch.setenv(settings.THREADS_ENV, "two")
    with pytest.raises(ValueError, match="WMARK_THREADS"):
        cpu_threads.plan_threads()


def test_an_unreadable_proc_stat_plans_every_core(two_cores, monkeypatch):
    monkeypatch.setattr(cpu_threads, "_STAT", cpu_threads.Path("/nonexistent/stat"))
    assert cpu_threads.plan_threads() == Plan(2, 2, "active")


def test_applying_a_plan_sets_torch_and_the_wait():
    # (the GEMM's count travels with the models' forward plans: test_forward_plan.py)
    import torch

    from wmark.generator.cpu import _int8_gemm

    before = torch.get_num_threads(), _int8_gemm.wait_policy()
    try:
        cpu_threads.apply_threads(Plan(1, 3, "passive"))
        assert (torch.get_num_threads(), _int8_gemm.wait_policy()) == (1, "passive")
    finally:
        torch.set_num_threads(before[0])
        _int8_gemm.wait_policy(before[1])


def _thread_cpus() -> dict[int, frozenset[int]]:
    """Each thread of this process (by native ID): the CPUs it may run on."""
    return {int(tid): frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning workers needs two CPUs")
def test_a_plan_moves_the_gemm_workers_and_never_the_caller():
    import threading

    import numpy as np
    import torch

    from wmark.generator.cpu import _int8_gemm
    from wmark.generator.cpu.rowwise import RowInt8Linear, gemm_threads_for

    before = torch.get_num_threads()
    layer = RowInt8Linear(*RowInt8Linear.quantize(_seeded_randn(64, 32)), None)
    allowed = frozenset(os.sched_getaffinity(0))
    target = min(allowed)
    caller = threading.get_native_id()
    try:
        cpu_threads.apply_threads(Plan(1, 2, "passive", frozenset({target})))
        with gemm_threads_for(2):
            layer(_seeded_randn(4, 32))  # starts the pool's worker where none ran yet
        threads = _thread_cpus()
        assert threads[caller] == allowed
        assert frozenset({target}) in {cpus for tid, cpus in threads.items() if tid != caller}
        cpu_threads.apply_threads(Plan(2, 2, "active"))  # a quiet plan: workers anywhere again
        assert frozenset({target}) not in set(_thread_cpus().values())
    finally:
        torch.set_num_threads(before)
        _int8_gemm.worker_cpus(None)
        _int8_gemm.wait_policy("active")
    with pytest.raises(ValueError, match="no CPU"):
        _int8_gemm.worker_cpus([])
    with pytest.raises(ValueError, match="out of range"):
        _int8_gemm.worker_cpus([np.iinfo(np.int32).max])


def _seeded_randn(*shape: int):
    """A seeded float32 tensor (the values do not matter here, only that the GEMM runs)."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_passive_wait_respects_a_choice_already_made(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    settings.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    settings.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_meter_counts_this_process_as_free_and_other_processes_as_busy(two_cores, monkeypatch):
    """Between two readings /proc/stat says one core was busy; the plan depends on whose it was."""
    own = {"cpu_s": 0.0}
    monkeypatch.setattr(cpu_threads.os, "sysconf", lambda _name: 100)  # 100 jiffies a second
    monkeypatch.setattr(cpu_threads.os, "times", lambda: os.times_result((own["cpu_s"], 0.0, 0.0, 0.0, 0.0)))
    clock = {"now": 0.0}
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: clock["now"])
    meter = cpu_threads.CoreMeter(min_window_s=0.2)

    def window(cpu0: tuple[int, int], cpu1: tuple[int, int], own_jiffies: int) -> None:
        two_cores(cpu0, cpu1)
        cpu_threads.time.sleep(0)  # the fixture's sleep moves the counters
        clock["now"] += 1.0
        own["cpu_s"] += own_jiffies / 100

    window((100, 0), (0, 100), own_jiffies=100)  # cpu0 was busy with this process: all free
    assert meter.plan() == Plan(2, 2, "active")
    window((100, 0), (0, 100), own_jiffies=0)  # now another process held cpu0
    assert meter.plan() == Plan(1, 2, "passive")
    window((100, 0), (100, 0), own_jiffies=150)  # both busy, 1.5 cores of it this process's
    assert meter.plan() == Plan(2, 2, "active")
    clock["now"] += 0.05  # too short a window to tell: the last plan stands
    assert meter.plan() == Plan(2, 2, "active")
    monkeypatch.setenv(settings.THREADS_ENV, "1")  # the user's choice: the meter stays out
    assert meter.plan() is None


def test_spinning_openmp_is_noted_once_and_only_where_it_matters(monkeypatch, caplog):
    monkeypatch.setattr(cpu_threads, "_WARNED", [])
    plan = cpu_threads.ThreadPlan(2, 2, "active")
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    cpu_threads.note_spinning_openmp(plan)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    cpu_threads.note_spinning_openmp(cpu_threads.ThreadPlan(1, 2, "passive"))  # no OpenMP team
    assert not caplog.records
    cpu_threads.note_spinning_openmp(plan)
    cpu_threads.note_spinning_openmp(plan)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "OMP_WAIT_POLICY=PASSIVE" in caplog.records[0].getMessage()
