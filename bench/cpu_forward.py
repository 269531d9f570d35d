"""Cost of one forward over M new tokens on this CPU: stock float32 vs wmark's int8 path.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/cpu_forward.py [--threads 2] [--rounds 3]

A forward over a few tokens should cost about what one token costs (the weights are read once).
With stock float32 kernels on this CPU it does not (GEMV for one row, a GEMM that scales badly
for 2-17 rows); wmark's `int8` precision (int8 weights, per-row int8 activations, row-by-row
attention: batch-invariant) is what the generator uses on CPU. Rows: target and drafter of the
embedded pair, after a 200-token prefix, M = 1, 2, 5, 9, 17 new tokens (a chain: every row sees
the ones before it). Rounds alternate between the precisions; the median is reported. The
drafter also runs with its output layer cut to the commonest 32,768 token IDs (`--drafter
embedded`'s default, `wmark.generator.drafters.truncated_head`), swapped in on the same int8 session.
`--precisions int8` skips the float32 rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from wmark.generator.drafters.truncated_head import DRAFT_VOCAB, TruncatedHead
from wmark.generator.models.loading import load_pair

SIZES = (1, 2, 5, 9, 17)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,int8", help="comma-separated: fp32, int8")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    pairs = {
        precision: load_pair("embedded", "embedded", precision=precision, threads=args.threads)
        for precision in precisions
    }
    drafter = pairs["int8"].drafter if "int8" in pairs else None
    heads: dict[str, torch.nn.Module] = {}
    if drafter is not None:  # the full output layer and the cut one, swapped on the same model
        full = drafter.model.get_output_embeddings()
        keep = torch.tensor(sorted(set(range(DRAFT_VOCAB)) | set(drafter.eos_token_ids)))
        heads = {"int8": full, "int8, head cut to 32k": TruncatedHead(full, keep, drafter.vocab_size)}
    text = "Explain in detail how photosynthesis works, step by step. " * 30
    ids = next(iter(pairs.values())).encode_prompt(text)[:240]
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
                variants = list(heads) if key == ("int8", "drafter") else [key[0]]
                for variant in variants:
                    if variant in heads:
                        assert drafter is not None
                        drafter.model.set_output_embeddings(heads[variant])
                    start = time.perf_counter()
                    session.extend(list(range(-1, m - 1)), ids[200 : 200 + m])
                    times.setdefault((variant, key[1], m), []).append(time.perf_counter() - start)
                    session.accept([], [])
    print(f"torch threads {args.threads}, {args.rounds} alternating rounds, median ms per forward")
    print()
    print("| model | precision | " + " | ".join(f"M={m}" for m in SIZES) + " | M=17 / M=1 |")
    print("|---|---|" + "---:|" * (len(SIZES) + 1))
    for role in ("target", "drafter"):
        for precision in [p for p in ("fp32", "int8", "int8, head cut to 32k") if (p, role, 1) in times]:
            ms = [1000 * statistics.median(times[(precision, role, m)]) for m in SIZES]
            print(
                f"| {role} | {precision} | "
                + " | ".join(f"{x:.0f}" for x in ms)
                + f" | {ms[-1] / ms[0]:.1f}x |"
            )


if __name__ == "__main__":
    main()
