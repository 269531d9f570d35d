"""Generation speed with one other core busy against the machine as it is, side by side in one run.

    WMARK_HOME=... .venv/bin/python bench/busy_cpu.py [--tokens 48] [--rounds 3] [--method default]

basic-uwm (or `--method default`: `wmark generate`'s speculative default, mpfr with the `auto`
drafter) on the embedded pair (int8, 48 tokens) runs alternately "quiet" (the machine as it is)
and "busy" (plus one process spinning on a core, started and stopped by this script), under three
settings, each in a process of its own because OpenMP reads its wait policy once at start:

- wmark: threads planned from the cores free before each run (`plan_threads`: torch on the free
  cores, the int8 GEMM on one more thread whose workers sleep between calls and stay off the
  freest core when a core is busy), waiting OpenMP threads sleep (`OMP_WAIT_POLICY=PASSIVE`):
  what `wmark generate` does;
- free cores only: torch and the GEMM both on the free cores, GEMM workers spinning briefly
  between calls (wmark before the GEMM's dynamic chunks);
- torch default: one thread per core, OpenMP's default wait policy.

Prints tokens/s (median over rounds) per setting and condition, the busy/quiet ratio, the thread
counts used (torch + GEMM, "p" where GEMM workers sleep between calls, "wN" for the CPUs they
were kept on) and the load average seen
before each run (the machine is shared, so say how busy it was), and whether every run of a round
gave the same text (it must: threads change only the speed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "wmark (plan_threads)": ("plan", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "free cores only (torch and GEMM)": ("free", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "torch default (all cores, default wait)": ("all", {}),
}
_THREAD_SETTINGS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "WMARK_THREADS")  # each setting sets its own
PROMPT = "Explain like I'm five: why is the sky blue?"


def child(mode: str, method: str, tokens: int, rounds: int) -> None:
    """Load once, then alternate quiet and busy runs; one JSON line per run on stdout."""
    from wmark import KeyMaterial, Secret, WatermarkSpec
    from wmark.detector import TextTokenizer
    from wmark.generator.cpu.threads import ThreadPlan, apply_threads, plan_threads
    from wmark.generator.drafters.build import build_drafter
    from wmark.generator.engine import SamplerConfig, generate
    from wmark.generator.models.embedded import embedded_tokenizer_json
    from wmark.generator.models.loading import load_pair

    speculative = method == "default"
    pair = load_pair("embedded", "embedded" if speculative else None)
    drafter = build_drafter("auto", pair.target, pair.drafter) if speculative else None
    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_b", secret=Secret(hashlib.sha256(b"busy").digest()), spec=WatermarkSpec(tokenizer=tok.ref)
    )
    ids = pair.encode_prompt(PROMPT)
    config = (
        SamplerConfig(method="mpfr", max_new_tokens=tokens)
        if speculative
        else SamplerConfig(method="basic-uwm", max_new_tokens=tokens)
    )
    generate(pair.target, ids, config=SamplerConfig(method="basic-uwm", max_new_tokens=4), key=key, seed=0)
    for r in range(rounds):
        for condition in ("quiet", "busy"):
            spinner = None
            if condition == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(0.5)  # let it take its core before the threads are chosen
            try:
                load = os.getloadavg()[0]
                plan = plan_threads()
                if mode == "free":
                    plan = ThreadPlan(plan.torch_threads, plan.torch_threads, "active")
                elif mode == "all":
                    cores = len(os.sched_getaffinity(0))
                    plan = ThreadPlan(cores, cores, "active")
                apply_threads(plan)
                out = generate(pair.target, ids, config=config, key=key, seed=r, drafter=drafter)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            rate = len(out.token_ids) / out.timings.total
            wait = "p" if plan.gemm_wait == "passive" else ""
            pinned = "" if plan.worker_cpus is None else f" w{','.join(map(str, sorted(plan.worker_cpus)))}"
            threads = f"{plan.torch_threads}+{plan.gemm_threads}{wait}{pinned}"
            row = {"condition": condition, "threads": threads, "load": load, "rate": rate}
            row["text"] = out.token_ids
            print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--method", choices=["basic-uwm", "default"], default="basic-uwm")
    parser.add_argument("--child", choices=[mode for mode, _env in SETTINGS.values()], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.method, args.tokens, args.rounds)
        return
    rounds = f"{args.rounds} rounds of quiet + busy"
    print(f"{os.cpu_count()} cores; {args.method}, {args.tokens} tokens, {rounds}\n")
    print(
        "| setting | quiet tokens/s | busy tokens/s | busy / quiet | threads quiet / busy | load avg seen |"
    )
    print("|---|---|---|---|---|---|")
    texts: dict[int, set[tuple[int, ...]]] = {}
    for name, (mode, env) in SETTINGS.items():
        proc = subprocess.run(
            [
                sys.executable,
                str(Path(__file__)),
                "--child",
                mode,
                "--tokens",
                str(args.tokens),
                "--rounds",
                str(args.rounds),
                "--method",
                args.method,
            ],
            env={**{k: v for k, v in os.environ.items() if k not in _THREAD_SETTINGS}, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for i, run in enumerate(runs):
            texts.setdefault(i // 2, set()).add(tuple(run["text"]))
        rate = {
            c: statistics.median(r["rate"] for r in runs if r["condition"] == c) for c in ("quiet", "busy")
        }
        threads = {c: sorted({r["threads"] for r in runs if r["condition"] == c}) for c in ("quiet", "busy")}
        loads = [r["load"] for r in runs]
        print(
            f"| {name} | {rate['quiet']:.2f} | {rate['busy']:.2f} | {rate['busy'] / rate['quiet']:.2f}x "
            f"| {threads['quiet']} / {threads['busy']} | {min(loads):.1f}-{max(loads):.1f} |",
            flush=True,
        )
    same = all(len(variants) == 1 for variants in texts.values())
    print(f"\nevery run of a round gave the same text: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
