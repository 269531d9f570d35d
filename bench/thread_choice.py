"""One forward on one thread against the thread plan's count, per model and row count.

    WMARK_HOME=... .venv/bin/python bench/thread_choice.py [--threads 2] [--rounds 12]

What `wmark.generator.cpu.thread_tuner` decides at run time, measured side by side: the embedded
target and the drafter as `build_drafter` makes it (head cut to 32k, 4-bit weights where they
pay), after a 300-token prefix, one forward over M new tokens (a chain), its int8 GEMMs and tree
attention on one thread or on `--threads`, the two alternating within every round so that drift
of a shared machine hits both alike. Median milliseconds and the ratio; both give the same bits.
How torch's OpenMP threads wait matters: run it with OMP_WAIT_POLICY=PASSIVE (what the CLI sets)
and without (torch's default, spinning: what a library user's process may have).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from wmark.generator.cpu.rowwise import gemm_threads_for
from wmark.generator.drafters.build import build_drafter
from wmark.generator.models.loading import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--sizes", default="1,2,4,8", help="comma-separated M: new tokens in one forward")
    args = parser.parse_args()
    if args.threads < 2:
        parser.error("--threads must be at least 2 (it is compared with one thread)")
    sizes = [int(m) for m in args.sizes.split(",")]
    pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)
    assert pair.drafter is not None
    build_drafter("embedded", pair.target, pair.drafter)
    if pair.drafter.plan.decoder is not None:
        pair.drafter.plan.decoder.tuner = None  # this script sets the count itself
    ids = pair.encode_prompt("Summarise in detail how photosynthesis works, step by step. " * 30)
    if len(ids) < 300 + max(sizes):
        parser.error("the built-in text is too short for these sizes")
    counts = (1, args.threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(f"{args.rounds} alternating rounds, median ms per forward after a 300-token prefix")
    print(f"OMP_WAIT_POLICY: {policy}")
    print()
    print(f"| model | M | 1 thread | {args.threads} threads | {args.threads} / 1 |")
    print("|---|---:|---:|---:|---:|")
    for role, model in (("target", pair.target), ("drafter", pair.drafter)):
        session = model.session(ids[:300])
        session.extend([], [])
        for m in sizes:
            times: dict[int, list[float]] = {c: [] for c in counts}
            for _ in range(args.rounds):
                for c in counts:
                    with gemm_threads_for(c):
                        start = time.perf_counter()
                        session.extend(list(range(-1, m - 1)), ids[300 : 300 + m])
                        times[c].append(time.perf_counter() - start)
                    session.accept([], [])
            one, many = (1000 * statistics.median(times[c]) for c in counts)
            print(f"| {role} | {m} | {one:.1f} | {many:.1f} | {many / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
