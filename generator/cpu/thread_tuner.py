"""How many threads a forward's kernels run on, chosen per forward shape from measurement.

More threads do not always pay. On a 2-core AMD EPYC (two vCPUs), in a process where torch's
OpenMP threads spin while they wait (OMP_WAIT_POLICY unset: an application that imports wmark
as a library), the 0.5B drafter's one-row forward was slower on two threads than on one (the
GEMM's second thread competed with a spinning OpenMP thread for the other core), while the 1.5B
target gained from the second thread at every row count. With OMP_WAIT_POLICY=PASSIVE (what the
CLI sets) two threads won everywhere there (bench/thread_choice.py; BENCHMARKS.md, "Kernels"),
and on a 2-core Xeon the drafter gained from them too. Which count wins
depends on the process, the CPU, the model and the rows of the forward, so it is measured, not
guessed. A `ThreadTuner` times a model's forwards on each candidate count (one thread, and the
count the thread plan gives), a few alternating probes per bucket of row counts, then runs the
faster one, and keeps probing the other now and then, since a shared machine's load changes:
one forward in `EXPLORE_EVERY` while the two are within `CLOSE` of each other, one in
`EXPLORE_RARELY` when the loser is clearly slower (each probe costs the difference).

The choice changes nothing but speed: the int8 GEMM and the tree attention give the same bits
on any number of threads (`wmark.generator.cpu._int8_gemm`, `_tree_attention`). Draft models use it
(`LeanDecoder(tune_threads=True)`); the target's forwards always gain from every thread.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from collections.abc import Iterator

from wmark.generator.cpu.rowwise import gemm_threads, gemm_threads_for

__all__ = ["CLOSE", "EXPLORE_EVERY", "EXPLORE_RARELY", "PROBES", "ThreadTuner"]

PROBES = 4
"""Forwards timed on each candidate count before a bucket's choice is made."""

EXPLORE_EVERY = 32
"""After the first probes, one forward in this many runs on the count not chosen..."""

EXPLORE_RARELY = 256
"""... or one in this many where that count's median time is more than `CLOSE` slower."""

CLOSE = 0.1

_BUCKETS = (1, 2, 4, 8, 16, 32)  # a forward of n rows falls in the first bucket >= n


class ThreadTuner:
    """Per bucket of row counts, the thread count whose recent forwards were the fastest."""

    def __init__(self, probes: int = PROBES, explore_every: int = EXPLORE_EVERY) -> None:
        if probes < 1 or explore_every < 2:
            raise ValueError("probes must be >= 1 and explore_every >= 2")
        self.probes = probes
        self.explore_every = explore_every
        self.explore_rarely = max(explore_every, EXPLORE_RARELY)
        # (bucket, threads) -> the last few forwards' seconds
        self._times: dict[tuple[int, int], deque[float]] = {}
        self._count: dict[int, int] = {}

    @contextlib.contextmanager
    def forward(self, rows: int) -> Iterator[None]:
        """Run the block (a forward over `rows` new rows) on the count chosen for its bucket,
        and time it. Forwards of more rows than the last bucket (a prompt) and machines with
        one thread are left alone."""
        full = gemm_threads()
        bucket = next((b for b in _BUCKETS if rows <= b), None)
        if bucket is None or full <= 1:
            yield
            return
        threads = self.choose(bucket, (1, full))
        start = time.perf_counter()
        with gemm_threads_for(threads):
            yield
        self.record(bucket, threads, time.perf_counter() - start)

    def choose(self, bucket: int, candidates: tuple[int, ...]) -> int:
        """The count the next forward of `bucket` runs on."""
        seen = {c: self._times.get((bucket, c), ()) for c in candidates}
        short = [c for c in candidates if len(seen[c]) < self.probes]
        if short:  # still probing: the candidate with the fewest samples (alternating)
            return min(short, key=lambda c: len(seen[c]))
        median = {c: statistics.median(seen[c]) for c in candidates}
        ranked = sorted(candidates, key=median.__getitem__)
        self._count[bucket] = n = self._count.get(bucket, 0) + 1
        close = median[ranked[1]] <= (1 + CLOSE) * median[ranked[0]]
        period = self.explore_every if close else self.explore_rarely
        if n % period == 0:
            return ranked[1 + (n // period) % (len(ranked) - 1)]
        return ranked[0]

    def record(self, bucket: int, threads: int, seconds: float) -> None:
        """A forward of `bucket` ran on `threads` in `seconds`."""
        self._times.setdefault((bucket, threads), deque(maxlen=2 * self.probes)).append(seconds)

    def chosen(self) -> dict[int, int]:
        """Each bucket probed so far: the count it runs on now (rows bucket -> threads)."""
        result = {}
        for bucket in sorted({b for b, _ in self._times}):
            timed = {c: statistics.median(t) for (b, c), t in self._times.items() if b == bucket}
            result[bucket] = min(timed, key=lambda c: timed[c])
        return result
