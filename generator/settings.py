"""The generator's configuration entry point: every environment variable wmark.generator honours
is read (or, for torch, written) here and nowhere else, so a library caller can see in one page
what the environment changes, and each module below takes plain values.

Read:
- `WMARK_THREADS` (else `OMP_NUM_THREADS`): the CPU thread count, a choice already made
  (`wmark.generator.cpu.threads.plan_threads` then plans nothing).
- `WMARK_MODEL_CACHE` (else `$WMARK_HOME/models`): where dequantised and int8 weights are kept.
- `OMP_WAIT_POLICY`: whether torch's OpenMP threads sleep while they wait (only advised on).

Written for torch, by the CLI, before any command imports torch (both are read only then):
- `OMP_WAIT_POLICY=PASSIVE` (`prefer_passive_wait`): a spinning OpenMP thread takes a core away
  from the int8 GEMM's workers.
- `THP_MEM_ALLOC_ENABLE=1` (`prefer_huge_pages`): torch marks allocations of 2 MB and more
  `MADV_HUGEPAGE`, so where the kernel's transparent-huge-page mode is `madvise` (the common
  default) the gigabytes of weights a load allocates fault in 2 MB at a time instead of 4 KB
  (about half the page faults, less system time: BENCHMARKS.md). Tensors that large are weights
  and caches, which live for the whole process, so the coarser pages cost no memory to speak of.
A user's own value of either is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from wmark.paths import data_home

__all__ = [
    "HUGE_PAGES_ENV",
    "THREADS_ENV",
    "model_cache",
    "openmp_waits_passively",
    "prefer_huge_pages",
    "prefer_passive_wait",
    "requested_threads",
]

THREADS_ENV = "WMARK_THREADS"
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def requested_threads(env: Mapping[str, str] | None = None) -> int | None:
    """`$WMARK_THREADS`, else `$OMP_NUM_THREADS` (a choice already made), else None.

    Raises:
        ValueError: the variable that decides is not a positive integer.
    """
    env = os.environ if env is None else env
    for variable in (THREADS_ENV, "OMP_NUM_THREADS"):
        if value := env.get(variable):
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{variable} must be a positive integer, got {value!r}")
            return int(value)
    return None


def model_cache(env: Mapping[str, str] | None = None) -> Path:
    """Cache root of model weights: `$WMARK_MODEL_CACHE`, else `$WMARK_HOME/models`."""
    env = os.environ if env is None else env
    if env.get("WMARK_MODEL_CACHE"):
        return Path(env["WMARK_MODEL_CACHE"]).expanduser()
    return data_home(env) / "models"


def openmp_waits_passively(env: Mapping[str, str] | None = None) -> bool:
    """Whether torch's OpenMP threads were told to sleep while they wait."""
    env = os.environ if env is None else env
    return env.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


def prefer_passive_wait() -> None:
    """Let OpenMP threads sleep while they wait (unless the user chose); call before importing torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def prefer_huge_pages() -> None:
    """Let torch use huge pages for tensors of 2 MB and more (unless the user chose); call before
    importing torch."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")
