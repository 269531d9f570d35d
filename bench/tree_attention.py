"""The tree-attention kernel on one thread and on the GEMM's pool, side by side.

    .venv/bin/python bench/tree_attention.py [--threads 1,2] [--rounds 5]

Random float32 inputs with the embedded pair's attention shapes (target: 12 query heads over 2
key/value heads of 128; drafter: 14 over 2 of 64), a tree of M rows after a prefix (the rows
see the prefix, some earlier tree rows and themselves), one call per layer as a forward makes
it. Rounds alternate the thread counts so that drift of a shared machine hits all alike; the
table gives microseconds per call (medians) and each count's time over one thread's. Every
count gives the same bits (tests/unit/generator/test_tree_attention.py), so only time differs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from wmark.generator.cpu import _tree_attention

SHAPES = {"target": (12, 2, 128), "drafter": (14, 2, 64)}  # query heads, key/value heads, head size


def _case(rng: np.random.Generator, heads: int, kv_heads: int, rows: int, keys: int, dim: int):
    q = rng.standard_normal((heads, rows, dim), dtype=np.float32)
    k = rng.standard_normal((kv_heads, keys, dim), dtype=np.float32)
    v = rng.standard_normal((kv_heads, keys, dim), dtype=np.float32)
    visible = np.zeros((rows, keys), dtype=np.uint8)
    visible[:, : keys - rows] = 1
    for i in range(rows):
        visible[i, keys - rows + np.flatnonzero(rng.random(i) < 0.5)] = 1
        visible[i, keys - rows + i] = 1
    out = np.empty((rows, heads, dim), dtype=np.float32)
    return q, k, v, visible, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated counts; the first is the base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="1,7,17", help="comma-separated M: tree rows in one call")
    parser.add_argument("--keys", default="300,1000", help="comma-separated context lengths (keys)")
    parser.add_argument("--calls", type=int, default=200, help="calls timed per measurement")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if not counts or min(counts) < 1:
        parser.error("--threads takes positive counts")
    rng = np.random.default_rng(0)
    print(f"kernel build: {_tree_attention.backend()}, pool: {_tree_attention.pooled()}")
    header = f"{'model':8} {'rows':>4} {'keys':>5} " + " ".join(f"{f'{t} thr us':>10}" for t in counts)
    print(header + "  " + " ".join(f"{f'{t}/{counts[0]}':>6}" for t in counts[1:]))
    for model, (heads, kv_heads, dim) in SHAPES.items():
        for rows in (int(m) for m in args.rows.split(",")):
            for keys in (int(n) for n in args.keys.split(",")):
                q, k, v, visible, out = _case(rng, heads, kv_heads, rows, keys, dim)
                times: dict[int, list[float]] = {t: [] for t in counts}
                for _ in range(args.rounds):
                    for t in counts:
                        start = time.perf_counter()
                        for _ in range(args.calls):
                            _tree_attention.attend(
                                q, k, v, visible, out, heads, kv_heads, rows, keys, dim, dim**-0.5, keys, t
                            )
                        times[t].append((time.perf_counter() - start) / args.calls * 1e6)
                med = {t: statistics.median(times[t]) for t in counts}
                cells = " ".join(f"{med[t]:10.1f}" for t in counts)
                ratios = " ".join(f"{med[t] / med[counts[0]]:6.2f}" for t in counts[1:])
                print(f"{model:8} {rows:4d} {keys:5d} {cells}  {ratios}")


if __name__ == "__main__":
    main()
