"""Generation speed on the embedded pair, every method side by side on the same prompts.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/generate_speed.py [--tokens 128] [--threads 2]

Rows: basic-uwm, pfr L=4, pfr-nowm L=4, mpfr B=2/4/8 L=4 (our sampling loop, CPU precision int8:
batch-invariant W8A8), and plain transformers `generate()` sampling (float32, stock kernels) as
the outside reference. For each: tokens/s, AATPS (mean ± sd over prompts), target forwards, and
where the time went (draft / verify / bookkeeping). Methods alternate prompt by prompt so that
drift of this shared machine hits all of them alike. The same key and seed are used throughout,
so the table also reports whether pfr/mpfr emitted exactly basic-uwm's tokens (drafter
invariance on the real models).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from dataclasses import dataclass, field

import torch

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import TextTokenizer
from wmark.generator.embedded import embedded_tokenizer_json
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.loading import load_pair, resolve_source

PROMPTS = [
    "Explain like I'm five: why is the sky blue?",
    "Explain like I'm five: how do airplanes stay up in the air?",
    "Explain like I'm five: why do we have to sleep?",
]
SETTINGS = [
    ("basic-uwm", "basic-uwm", 1),
    ("pfr L=4", "pfr", 1),
    ("pfr-nowm L=4", "pfr-nowm", 1),
    ("mpfr B=2 L=4", "mpfr", 2),
    ("mpfr B=4 L=4", "mpfr", 4),
    ("mpfr B=8 L=4", "mpfr", 8),
]


@dataclass
class Row:
    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0
    aatps: list[float] = field(default_factory=list)
    draft: float = 0.0
    verify: float = 0.0
    bookkeeping: float = 0.0
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    diverse: list[int] = field(default_factory=list)
    masked: list[int] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--skip-hf", action="store_true", help="skip the transformers generate() reference")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pair = load_pair("embedded", "embedded", precision=args.precision)
    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_bench",
        secret=Secret(hashlib.sha256(b"bench key").digest()),
        spec=WatermarkSpec(tokenizer=tok.ref),
    )
    hf_model = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(
            str(resolve_source("embedded", "target")), dtype=torch.float32
        )

    rows: dict[str, Row] = {name: Row() for name, *_ in SETTINGS}
    if hf_model is not None:
        rows["transformers generate() fp32"] = Row()
    for i, prompt in enumerate(PROMPTS):
        ids = pair.encode_prompt(prompt)
        for name, method, drafts in SETTINGS:
            config = SamplerConfig(method=method, drafts=drafts, lookahead=4, max_new_tokens=args.tokens)
            out = generate(pair.target, ids, config=config, key=key, drafter=pair.drafter, seed=i)
            row = rows[name]
            row.tokens += len(out.token_ids)
            row.seconds += out.timings.total
            row.forwards += out.target_forwards
            row.aatps.append(out.aatps)
            row.draft += out.timings.draft
            row.verify += out.timings.verify
            row.bookkeeping += out.timings.bookkeeping
            row.outputs.append(out.token_ids)
            row.diverse.append(len(out.diverse_positions))
            row.masked.append(len(out.masked_positions))
            print(
                f"  {name:>14} prompt {i}: {len(out.token_ids)} tokens, {out.tokens_per_s:.2f} tok/s, "
                f"AATPS {out.aatps:.2f}",
                flush=True,
            )
        if hf_model is not None:
            torch.manual_seed(i)
            start = time.perf_counter()
            with torch.inference_mode():
                gen = hf_model.generate(
                    torch.tensor([ids]),
                    do_sample=True,
                    top_k=50,
                    temperature=1.0,
                    max_new_tokens=args.tokens,
                    min_new_tokens=args.tokens,
                )
            seconds = time.perf_counter() - start
            row = rows["transformers generate() fp32"]
            n = gen.shape[1] - len(ids)
            row.tokens += n
            row.seconds += seconds
            row.forwards += n
            row.aatps.append(1.0)
            print(f"  transformers prompt {i}: {n} tokens, {n / seconds:.2f} tok/s", flush=True)

    base = rows["basic-uwm"]
    print()
    print(
        f"{len(PROMPTS)} prompts x {args.tokens} new tokens, "
        f"torch threads {args.threads}, precision {args.precision}"
    )
    print()
    print(
        "| method | tokens/s | vs basic-uwm | AATPS (mean ± sd) | target forwards | draft s | verify s | "
        "bookkeeping s | same tokens as basic-uwm | diversity / masked positions per answer |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        rate = row.tokens / row.seconds
        same = (
            "n/a"
            if not row.outputs or name == "pfr-nowm L=4"
            else f"{sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True))}/{len(row.outputs)}"
        )
        sd = statistics.stdev(row.aatps) if len(row.aatps) > 1 else 0.0
        print(
            f"| {name} | {rate:.2f} | {rate / (base.tokens / base.seconds):.2f}x | "
            f"{statistics.mean(row.aatps):.2f} ± {sd:.2f} | {row.forwards} | {row.draft:.1f} | "
            f"{row.verify:.1f} | {row.bookkeeping:.1f} | {same} | "
            f"{statistics.mean(row.diverse or [0]):.1f} / {statistics.mean(row.masked or [0]):.1f} |"
        )


if __name__ == "__main__":
    main()
