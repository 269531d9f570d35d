"""Generation speed with one other core busy against the machine as it is, side by side in one run.

    WMARK_HOME=... .venv/bin/python bench/busy_cpu.py [--tokens 48] [--rounds 3]

basic-uwm on the embedded pair (int8, 48 tokens) runs alternately "quiet" (the machine as it is)
and "busy" (plus one process spinning on a core, started and stopped by this script), under two
settings, each in a process of its own because OpenMP reads its wait policy once at start:

- wmark: threads chosen from the cores free before each run (`choose_threads`), waiting
  OpenMP threads sleep (`OMP_WAIT_POLICY=PASSIVE`): what `wmark generate` does;
- torch default: one thread per core, OpenMP's default wait policy (wmark before this change).

Prints tokens/s (median over rounds) per setting and condition, the busy/quiet ratio, the thread
counts used and the load average seen before each run: the machine is shared, so say how busy it was.
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
    "wmark (free cores, passive wait)": ("auto", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "torch default (all cores, default wait)": ("all", {}),
}
_THREAD_SETTINGS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "WMARK_THREADS")  # each setting sets its own
PROMPT = "Explain like I'm five: why is the sky blue?"


def child(mode: str, tokens: int, rounds: int) -> None:
    """Load once, then alternate quiet and busy runs; one JSON line per run on stdout."""
    import torch

    from wmark import KeyMaterial, Secret, WatermarkSpec
    from wmark.detector import TextTokenizer
    from wmark.generator.cpu_threads import choose_threads
    from wmark.generator.embedded import embedded_tokenizer_json
    from wmark.generator.engine import SamplerConfig, generate
    from wmark.generator.loading import load_pair

    pair = load_pair("embedded", None)
    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_b", secret=Secret(hashlib.sha256(b"busy").digest()), spec=WatermarkSpec(tokenizer=tok.ref)
    )
    ids = pair.encode_prompt(PROMPT)
    config = SamplerConfig(method="basic-uwm", max_new_tokens=tokens)
    generate(pair.target, ids, config=SamplerConfig(method="basic-uwm", max_new_tokens=4), key=key, seed=0)
    for r in range(rounds):
        for condition in ("quiet", "busy"):
            spinner = None
            if condition == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(0.5)  # let it take its core before the threads are chosen
            try:
                load = os.getloadavg()[0]
                threads = choose_threads() if mode == "auto" else os.cpu_count() or 1
                torch.set_num_threads(threads)
                out = generate(pair.target, ids, config=config, key=key, seed=r)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            rate = len(out.token_ids) / out.timings.total
            print(
                json.dumps({"condition": condition, "threads": threads, "load": load, "rate": rate}),
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["auto", "all"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tokens, args.rounds)
        return
    print(f"{os.cpu_count()} cores; basic-uwm, {args.tokens} tokens, {args.rounds} rounds of quiet + busy\n")
    print(
        "| setting | quiet tokens/s | busy tokens/s | busy / quiet | threads quiet / busy | load avg seen |"
    )
    print("|---|---|---|---|---|---|")
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
            ],
            env={**{k: v for k, v in os.environ.items() if k not in _THREAD_SETTINGS}, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
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


if __name__ == "__main__":
    main()
