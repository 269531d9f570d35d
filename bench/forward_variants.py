"""What the cheaper forwards save: fused int8 projections, and stock attention for the drafter.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/forward_variants.py [--threads 1] [--rounds 5]

On the embedded pair (int8, drafter head cut to 32k as `--drafter embedded` has it), after a
200-token prefix, one forward over M = 1, 2, 5, 9 new tokens (a chain), each variant swapped in
on the same session and the variants alternating within every round, so that this shared
machine's drift hits them alike. Rows: target and drafter with q/k/v and gate/up as separate
GEMMs vs fused (`wmark.generator.models.fused`; the logits are also compared bit for bit), and the
drafter with the batch-invariant row-by-row attention vs stock SDPA (what `build_drafter` gives
a draft model). Median milliseconds per forward, CPU time of this process at one thread (wall
time at more), so that other processes' load counts less.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

import wmark.generator.models.prepare as prepare
from wmark.generator.drafters.truncated_head import truncate_head
from wmark.generator.models.fused import GROUPS, fuse_projections
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import load_pair

SIZES = (1, 2, 5, 9)


def _swaps(model: nn.Module) -> dict[str, Callable[[], None]]:
    """Setters for the unfused and fused projections of `model` (which must start unfused)."""
    groups = [(m, names) for m in model.modules() for names in GROUPS if all(hasattr(m, n) for n in names)]
    plain = [(m, n, getattr(m, n)) for m, names in groups for n in names]
    fuse_projections(model)
    fused = [(m, n, getattr(m, n)) for m, names in groups for n in names]

    def setter(layers: Sequence[tuple[nn.Module, str, nn.Module]]) -> Callable[[], None]:
        def apply() -> None:
            for module, name, layer in layers:
                setattr(module, name, layer)

        return apply

    return {"separate GEMMs": setter(plain), "fused": setter(fused)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    loaded = prepare.fuse_projections
    prepare.fuse_projections = lambda _model: 0  # load unfused; `_swaps` fuses on the side
    try:
        pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)
    finally:
        prepare.fuse_projections = loaded
    assert pair.drafter is not None
    models: dict[str, HFModel] = {"target": pair.target, "drafter": truncate_head(pair.drafter)}
    ids = pair.encode_prompt("Explain in detail how photosynthesis works, step by step. " * 30)[:240]
    swaps = {role: _swaps(model.model) for role, model in models.items()}
    sessions = {role: model.session(ids[:200]) for role, model in models.items()}
    plans = {role: model.plan for role, model in models.items()}
    for session in sessions.values():
        session.extend([], [])

    def variants(role: str) -> dict[str, Callable[[], None]]:
        out = dict(swaps[role])
        if role == "drafter":

            def stock() -> None:
                swaps["drafter"]["fused"]()
                drafter = models["drafter"]
                drafter.plan = dataclasses.replace(drafter.plan, rows_exact=False, decoder=None)

            out["fused + stock attention"] = stock
        return out

    clock = time.process_time if args.threads == 1 else time.perf_counter
    times: dict[tuple[str, str, int], list[float]] = {}
    logits: dict[tuple[str, str, int], torch.Tensor] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up
        for m in SIZES:
            for role, session in sessions.items():
                for name, apply in variants(role).items():
                    models[role].plan = plans[role]
                    apply()
                    start = clock()
                    _, rows = session.extend(list(range(-1, m - 1)), ids[200 : 200 + m])
                    elapsed = clock() - start
                    session.accept([], [])
                    logits[(role, name, m)] = rows
                    if rnd:
                        times.setdefault((role, name, m), []).append(1000 * elapsed)
    print(f"torch threads {args.threads}, {args.rounds} alternating rounds, median ms per forward")
    print()
    print("| model | variant | " + " | ".join(f"M={m}" for m in SIZES) + " | logits vs separate GEMMs |")
    print("|---|---|" + "---:|" * (len(SIZES) + 1))
    for role in models:
        for name in variants(role):
            ms = [statistics.median(times[(role, name, m)]) for m in SIZES]
            same = all(
                torch.equal(logits[(role, name, m)], logits[(role, "separate GEMMs", m)]) for m in SIZES
            )
            print(
                f"| {role} | {name} | "
                + " | ".join(f"{x:.1f}" for x in ms)
                + f" | {'bit-identical' if same else 'differ'} |"
            )


if __name__ == "__main__":
    main()
