"""wmark's int8 GEMM builds side by side on the embedded pair: prefill and forwards over M rows.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/int8_kernels.py [--threads 1] [--rounds 3]

Every build this CPU runs (`_int8_gemm.backends()`: amx, avx512vnni, avx2; `--kernels` picks) is
timed on the same sessions, rounds alternating build by build so that drift of a shared machine
hits all alike: the prompt prefill of the target and the drafter (`--prefill` token counts) and
one forward over M new tokens after a 200-token prefix (`--sizes`); the drafter also with its
weights cut to 4 bits (`wmark.generator.drafters.int4_weights`, what `build_drafter` does on VNNI CPUs).
`--prefetch near,far,rows` also crosses them with the weight prefetch policies (`_int8_gemm.prefetch`:
into L1 96 groups ahead, into L2 192 ahead (Intel's default), or near below 9 quantised rows in a
call (5 with 4-bit weights) and far from there (AMD's)). `--activations two,outliers,one,fast` times
the target with each way of quantising its rows (`RowInt8Linear.activations`; the default,
two, alone without it); `fast` is `--precision int8-fast`'s target: outliers on its block-scaled
weights (`RowInt8Linear.scale_cols`). Every build gives the
same bits (tests/integration/generator/test_rowwise_int8.py), so only the time differs; the table
reports milliseconds (medians) and each variant's time over the first one's.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time

import machine

from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import ACTIVATIONS
from wmark.generator.drafters.int4_weights import cut_to_int4
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.loading import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--kernels", default=None, help="comma-separated builds; default: every one but portable"
    )
    parser.add_argument(
        "--prefetch", default=None, help="comma-separated: near, far, rows; default: this CPU's"
    )
    parser.add_argument("--prefill", default="200,500", help="comma-separated prompt lengths (tokens)")
    parser.add_argument("--sizes", default="1,9,17,33", help="comma-separated M: new tokens in one forward")
    parser.add_argument(
        "--activations", default="two", help="comma-separated target row modes: two, outliers, one"
    )
    args = parser.parse_args()
    builds = (
        args.kernels.split(",") if args.kernels else [k for k in _int8_gemm.backends() if k != "portable"]
    )
    default_policy = _int8_gemm.prefetch()
    policies = args.prefetch.split(",") if args.prefetch else [default_policy]
    variants = {
        (f"{build}/{policy}" if len(policies) > 1 else build): (build, policy)
        for build, policy in itertools.product(builds, policies)
    }
    kernels = list(variants)
    prefills = [int(n) for n in args.prefill.split(",")]
    sizes = [int(m) for m in args.sizes.split(",")]

    pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)
    assert pair.drafter is not None
    text = "Explain in detail how photosynthesis works, step by step, for a curious reader. " * 60
    ids = pair.encode_prompt(text)
    if len(ids) < max(prefills + [200 + max(sizes)]):
        parser.error("the built-in text is too short for these lengths")
    four = copy.deepcopy(pair.drafter)  # the drafter with 4-bit weights, as build_drafter cuts it
    cut_to_int4(four.model)
    modes = args.activations.split(",")
    if unknown := set(modes) - {*ACTIVATIONS, "fast"}:
        parser.error(f"unknown activations {sorted(unknown)}; known: {', '.join(ACTIVATIONS)}, fast")
    fast = None
    if "fast" in modes:
        fast = load_pair("embedded", None, precision="int8-fast", threads=args.threads).target
    targets = {
        ("target" if modes == ["two"] else f"target, {mode}"): mode if mode != "fast" else "outliers"
        for mode in modes
    }
    models = {
        **{role: fast if role.endswith("fast") and fast is not None else pair.target for role in targets},
        "drafter": pair.drafter,
        "drafter, 4-bit weights": four,
    }
    times: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.rounds):
        for role, model in models.items():
            if role in targets:
                for layer in int8_layers(model.model):
                    layer.activations = targets[role]
            for kernel, (build, policy) in variants.items():
                _int8_gemm.use_backend(build)
                _int8_gemm.prefetch(policy)
                for n in prefills:
                    session = model.session(ids[:n])
                    start = time.perf_counter()
                    session.extend([], [])  # the prefill alone
                    times.setdefault((role, f"prefill {n}", kernel), []).append(time.perf_counter() - start)
                session = model.session(ids[:200])
                session.extend([], [])
                for m in sizes:
                    start = time.perf_counter()
                    session.extend(list(range(-1, m - 1)), ids[200 : 200 + m])  # a chain of m rows
                    times.setdefault((role, f"M={m}", kernel), []).append(time.perf_counter() - start)
                    session.accept([], [])
    _int8_gemm.use_backend(_int8_gemm.backends()[0])
    _int8_gemm.prefetch(default_policy)

    print(f"threads {args.threads}, {args.rounds} alternating rounds, median ms; ratio: over {kernels[0]}")
    print(machine.describe())
    print()
    columns = kernels + [f"{k} / {kernels[0]}" for k in kernels[1:]]
    print("| model | work | " + " | ".join(columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    for role in models:
        for work in [f"prefill {n}" for n in prefills] + [f"M={m}" for m in sizes]:
            ms = [1000 * statistics.median(times[(role, work, k)]) for k in kernels]
            cells = [f"{x:.0f}" for x in ms] + [f"{x / ms[0]:.2f}x" for x in ms[1:]]
            print(f"| {role} | {work} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
