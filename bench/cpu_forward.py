"""Cost of one forward over M new tokens on this CPU: stock float32 vs wmark's int8 path.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/cpu_forward.py [--threads 2] [--rounds 3]

A forward over a few tokens should cost about what one token costs (the weights are read once).
With stock float32 kernels on this CPU it does not (GEMV for one row, a GEMM that scales badly
for 2-17 rows); wmark's `int8` precision (int8 weights, per-row int8 activations, row-by-row
attention: batch-invariant) is what the generator uses on CPU. Rows: target and drafter of the
embedded pair, after a 200-token prefix, M = 1, 2, 5, 9, 17 new tokens (a chain: every row sees
the ones before it). Rounds alternate between the precisions; the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from wmark.generator.loading import load_pair

SIZES = (1, 2, 5, 9, 17)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pairs = {
        precision: load_pair("embedded", "embedded", precision=precision) for precision in ("fp32", "int8")
    }
    ids = pairs["int8"].encode_prompt("Explain in detail how photosynthesis works, step by step. " * 30)[:240]
    sessions = {}
    for precision, pair in pairs.items():
        for role, model in (("target", pair.target), ("drafter", pair.drafter)):
            assert model is not None
            session = model.session(ids[:200])
            session.extend([], [])
            sessions[(precision, role)] = session
    times: dict[tuple[str, str, int], list[float]] = {}
    for _ in range(args.rounds):
        for m in SIZES:
            for key, session in sessions.items():
                start = time.perf_counter()
                session.extend(list(range(-1, m - 1)), ids[200 : 200 + m])
                times.setdefault((*key, m), []).append(time.perf_counter() - start)
                session.accept([], [])
    print(f"torch threads {args.threads}, {args.rounds} alternating rounds, median ms per forward")
    print()
    print("| model | precision | " + " | ".join(f"M={m}" for m in SIZES) + " | M=17 / M=1 |")
    print("|---|---|" + "---:|" * (len(SIZES) + 1))
    for role in ("target", "drafter"):
        for precision in ("fp32", "int8"):
            ms = [1000 * statistics.median(times[(precision, role, m)]) for m in SIZES]
            print(
                f"| {role} | {precision} | "
                + " | ".join(f"{x:.0f}" for x in ms)
                + f" | {ms[-1] / ms[0]:.1f}x |"
            )


if __name__ == "__main__":
    main()
