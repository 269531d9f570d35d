"""How many CPU threads wmark computes with: chosen from the cores free right now.

Torch's default, one thread per core with OpenMP threads spinning while they wait, collapses
when another process holds a core: every parallel region waits for the thread that shares the
busy core (measured: `basic-uwm` fell from 9.5 to 1.3 tokens/s with one of two cores busy). So
before a model is loaded, wmark counts the cores that sat idle over a short window (/proc/stat)
and plans (`ThreadPlan`):

- torch's own ops (norms, attention, sampling) run on that many threads: they synchronise at
  every op, so a thread on a busy core would hold each one up;
- wmark's int8 GEMM, the bulk of a forward, runs on one thread more when a core is busy (at most
  one per allowed core), whose workers sleep between calls ("passive"): its calls hand out
  chunks dynamically and never wait for a late thread (`wmark.generator.cpu._int8_gemm`), so the
  extra thread adds whatever share of the busy core the scheduler gives it, and a thread that
  sleeps between calls is run promptly when woken (BENCHMARKS.md, "Generation speed on CPU"). On a quiet
  machine the workers spin briefly between calls ("active"), which measured faster than sleeping;
- the GEMM's workers stay off the freest core (`worker_cpus`), where the calling thread, which
  runs everything between GEMM calls, is then left alone: a worker woken onto that core took
  turns with the caller while the other process kept the other core.

An explicit count (`load_pair(threads=...)`, `WMARK_THREADS` or `OMP_NUM_THREADS`) is used for
both, with active waiting: the user has chosen.

A long-lived process (the OpenAI-compatible server) plans again before each generation with a
`CoreMeter`: the cores that other processes left idle since its last reading, counting this
process's own CPU time as free, so that generating does not make the machine look busy and no
reading waits for a window to pass. Its readings cannot tell which core is the free one (its own
work was spread over all of them), so its plans leave the workers on any core.

The CLI also asks OpenMP to let waiting threads sleep instead of spin (`OMP_WAIT_POLICY=PASSIVE`,
unless set): OpenMP reads it once, when torch is imported, before any load could measure the
machine, and a spinning thread takes a core away from whatever else runs there.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wmark.generator.settings import openmp_waits_passively, requested_threads

__all__ = [
    "CoreMeter",
    "ThreadPlan",
    "apply_threads",
    "free_cores",
    "idle_fractions",
    "plan_threads",
    "note_spinning_openmp",
]

_LOG = logging.getLogger(__name__)
_WARNED: list[bool] = []  # the spinning-OpenMP note is logged once per process
_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class ThreadPlan:
    """Threads for torch's ops and for the int8 GEMM, how idle GEMM workers wait, and the CPUs
    the GEMM's workers may run on (None: any)."""

    torch_threads: int
    gemm_threads: int
    gemm_wait: Literal["active", "passive"]
    worker_cpus: frozenset[int] | None = None


def _cpu_times() -> dict[int, tuple[int, int]]:
    """(idle, total) jiffies per CPU number, from /proc/stat."""
    times = {}
    for line in _STAT.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (values[3] + values[4], sum(values))
    return times


def idle_fractions(window_s: float = 0.25) -> dict[int, float] | None:
    """Each of this process's CPUs: the fraction of `window_s` seconds it sat idle; None if unknown."""
    allowed = os.sched_getaffinity(0)
    try:
        before = _cpu_times()
        time.sleep(window_s)
        after = _cpu_times()
    except (OSError, ValueError):
        return None
    idle = {}
    for cpu in sorted(allowed):
        if cpu in before and cpu in after:
            idle_jiffies, total = (a - b for a, b in zip(after[cpu], before[cpu], strict=True))
            idle[cpu] = idle_jiffies / total if total > 0 else 1.0
    return idle


def free_cores(window_s: float = 0.25) -> float | None:
    """Idle capacity of this process's CPUs over `window_s` seconds, in cores; None if unknown."""
    idle = idle_fractions(window_s)
    return None if idle is None else sum(idle.values())


def _requested(requested: int | None) -> int | None:
    """`requested`, else the environment's choice (`wmark.generator.settings.requested_threads`)."""
    return max(1, requested) if requested is not None else requested_threads()


def _plan_for(free: float, cores: int, worker_cpus: frozenset[int] | None = None) -> ThreadPlan:
    """The plan for `free` idle cores of `cores` (a core counts when idle half of the time); when
    a core is busy, the GEMM's workers run on `worker_cpus` (None: any CPU)."""
    threads = max(1, min(cores, math.floor(free + 0.5)))
    if threads == cores:
        return ThreadPlan(threads, threads, "active")
    return ThreadPlan(threads, threads + 1, "passive", worker_cpus)


def plan_threads(requested: int | None = None) -> ThreadPlan:
    """The plan for this machine now (see the module docstring).

    A core counts as free when it was idle at least half of the window; torch gets at least
    one thread.

    Raises:
        ValueError: the variable that decides is not a positive integer.
    """
    chosen = _requested(requested)
    if chosen is not None:
        return ThreadPlan(chosen, chosen, "active")
    cores = len(os.sched_getaffinity(0))
    idle = idle_fractions()
    if not idle:
        return ThreadPlan(cores, cores, "active")
    freest = max(idle, key=lambda cpu: (idle[cpu], -cpu))  # ties: the lowest CPU number
    return _plan_for(sum(idle.values()), cores, frozenset(idle) - {freest} or None)


class CoreMeter:
    """Plans from the cores other processes used since the last reading (no waiting window).

    `plan()` returns None where the user chose the thread count (the environment decides, as at
    load) or where /proc/stat cannot be read, and keeps the last plan while less than
    `min_window_s` has passed (too few jiffies to tell).
    """

    def __init__(self, min_window_s: float = 0.2) -> None:
        self.min_window_s = min_window_s
        self._last = self._read()
        self._plan: ThreadPlan | None = None

    @staticmethod
    def _read() -> tuple[float, dict[int, tuple[int, int]], float] | None:
        """(monotonic time, per-CPU (idle, total) jiffies, this process's CPU jiffies), or None."""
        try:
            times = _cpu_times()
        except (OSError, ValueError):
            return None
        own = os.times()
        return time.monotonic(), times, (own.user + own.system) * os.sysconf("SC_CLK_TCK")

    def plan(self) -> ThreadPlan | None:
        """The plan for the machine since the last reading (see the class docstring)."""
        if _requested(None) is not None:
            return None
        now, last = self._read(), self._last
        if now is None or last is None:
            self._last = now
            return None
        if now[0] - last[0] < self.min_window_s and self._plan is not None:
            return self._plan
        allowed = [cpu for cpu in os.sched_getaffinity(0) if cpu in now[1] and cpu in last[1]]
        idle = sum(now[1][cpu][0] - last[1][cpu][0] for cpu in allowed)
        total = sum(now[1][cpu][1] - last[1][cpu][1] for cpu in allowed)
        self._last = now
        if not allowed or total <= 0:
            return self._plan
        per_cpu = total / len(allowed)  # jiffies each CPU counted over the window
        free = min(len(allowed), (idle + now[2] - last[2]) / per_cpu)
        self._plan = _plan_for(free, len(os.sched_getaffinity(0)))
        return self._plan


def apply_threads(plan: ThreadPlan) -> None:
    """Make `plan` the process's: torch's thread count, the GEMM workers' wait policy and
    the CPUs its workers run on (the calling thread is never moved)."""
    import torch  # not at import: planning must not import torch (OpenMP reads its policy then)

    from wmark.generator.cpu import _int8_gemm

    torch.set_num_threads(plan.torch_threads)
    _int8_gemm.wait_policy(plan.gemm_wait)
    _int8_gemm.worker_cpus(None if plan.worker_cpus is None else sorted(plan.worker_cpus))
    note_spinning_openmp(plan)


def note_spinning_openmp(plan: ThreadPlan) -> None:
    """Log once that torch's OpenMP threads spin in this process, where that slows generation:
    after each torch op they keep a core busy while the GEMM's workers want it (the target's
    one-row forward measured a third slower: BENCHMARKS.md). The CLI sets the policy itself
    (`wmark.generator.settings.prefer_passive_wait`); a library caller must set it before torch
    is imported, which is why this can only advise."""
    if _WARNED or plan.torch_threads < 2 or openmp_waits_passively():
        return
    _WARNED.append(True)
    _LOG.warning(
        "OMP_WAIT_POLICY is not PASSIVE: torch's OpenMP threads spin between ops and slow wmark's "
        "int8 GEMM workers (about a third of a forward). Set OMP_WAIT_POLICY=PASSIVE before importing torch."
    )
