"""How many CPU threads torch computes with: as many as there are cores free right now.

Torch's default, one thread per core with OpenMP threads spinning while they wait, collapses
when another process holds a core: every parallel region waits for the thread that shares the
busy core (measured: `basic-uwm` fell from 9.5 to 1.3 tokens/s with one of two cores busy). So
before a model is loaded, wmark counts the cores that sat idle over a short window (/proc/stat)
and uses that many threads. An explicit count, `WMARK_THREADS` or `OMP_NUM_THREADS` overrides
the measurement.

The CLI also asks OpenMP to let waiting threads sleep instead of spin (`OMP_WAIT_POLICY=PASSIVE`,
unless set): OpenMP reads it once, when torch is imported, before any load could measure the
machine, and a spinning thread takes a core away from whatever else runs there.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

__all__ = ["THREADS_ENV", "choose_threads", "free_cores", "prefer_passive_wait"]

THREADS_ENV = "WMARK_THREADS"
_STAT = Path("/proc/stat")


def _cpu_times() -> dict[int, tuple[int, int]]:
    """(idle, total) jiffies per CPU number, from /proc/stat."""
    times = {}
    for line in _STAT.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (values[3] + values[4], sum(values))
    return times


def free_cores(window_s: float = 0.25) -> float | None:
    """Idle capacity of this process's CPUs over `window_s` seconds, in cores; None if unknown."""
    allowed = os.sched_getaffinity(0)
    try:
        before = _cpu_times()
        time.sleep(window_s)
        after = _cpu_times()
    except (OSError, ValueError):
        return None
    free = 0.0
    for cpu in allowed:
        if cpu in before and cpu in after:
            idle, total = (a - b for a, b in zip(after[cpu], before[cpu], strict=True))
            free += idle / total if total > 0 else 1.0
    return free


def choose_threads(requested: int | None = None) -> int:
    """Threads to compute with: `requested`, else `$WMARK_THREADS` or `$OMP_NUM_THREADS` (a
    choice already made), else the cores free now.

    A core counts as free when it was idle at least half of the window; at least one thread.

    Raises:
        ValueError: the variable that decides is not a positive integer.
    """
    for variable in (THREADS_ENV, "OMP_NUM_THREADS"):
        if requested is not None:
            break
        if value := os.environ.get(variable):
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{variable} must be a positive integer, got {value!r}")
            requested = int(value)
    if requested is not None:
        return max(1, requested)
    cores = len(os.sched_getaffinity(0))
    free = free_cores()
    if free is None:
        return cores
    return max(1, min(cores, math.floor(free + 0.5)))


def prefer_passive_wait() -> None:
    """Let OpenMP threads sleep while they wait (unless the user chose); call before importing torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
