"""Generation speed on the embedded pair, every method side by side on the same prompts.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/generate_speed.py [--tokens 128] [--threads 2]

Rows: basic-uwm, pfr L=4, pfr-nowm L=4, mpfr B=2/4/8 L=4 (our sampling loop, at the precision a
user of this CPU gets: `--precision auto`, int8 with AMX tiles, int8-fast without), and plain
transformers `generate()` sampling (float32, stock kernels) as the outside reference. For each:
tokens/s (end to end, and for decoding alone: the prompt's prefill is the same target forward
for every method, plus the draft model's own, and drafting cannot speed it up), AATPS (mean ± sd
over prompts), target forwards, and where the time went (prefill / draft / verify /
bookkeeping). Methods alternate prompt by prompt so that drift of this shared machine hits all
of them alike. The same key and seed are used throughout, so the table also reports whether
pfr/mpfr emitted exactly basic-uwm's tokens (drafter invariance on the real models). `--kernels
amx,avx512vnni` runs every row on each int8 GEMM build in turn, prompt by prompt (one table per
set and build). `bench/draft_rules.py` compares drafting settings by their counts instead, free
of the drift.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import statistics
import time
from dataclasses import dataclass, field

import machine
import torch

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import TextTokenizer
from wmark.eval.models import prompt_encoder
from wmark.eval.prompts import load_prompt_set
from wmark.generator.cpu import _int8_gemm
from wmark.generator.drafters.build import build_drafter, drafter_model_source
from wmark.generator.drafters.hybrid import HybridDrafter
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models.embedded import embedded_tokenizer_json
from wmark.generator.models.loading import load_pair, resolve_source
from wmark.generator.models.prepare import cpu_precision
from wmark.generator.names import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_LOOKAHEAD

PROMPTS = [
    "Explain like I'm five: why is the sky blue?",
    "Explain like I'm five: how do airplanes stay up in the air?",
    "Explain like I'm five: why do we have to sleep?",
]


@dataclass(frozen=True)
class Setting:
    method: str
    drafts: int | None = None  # None: the sampler's default
    lookahead: int | None = None
    drafter: str | None = None  # a `--drafter` name; None for basic-uwm
    confidence: float | None = None  # dynamic lookahead threshold; None: the default
    lookup: int | None = None  # lookup_lookahead (free lookup drafts past L); None: the default
    reach: float | None = None  # min_reach (priced verify rows); None: the default
    rows: int | None = None  # max_rows; None: the default


SETTINGS = {
    "basic-uwm": Setting("basic-uwm"),
    "pfr L=4": Setting("pfr", 1, 4, "embedded", 0.0),
    "pfr-nowm L=4": Setting("pfr-nowm", 1, 4, "embedded", 0.0),
    "mpfr B=2 L=4": Setting("mpfr", 2, 4, "embedded", 0.0),
    "mpfr B=4 L=4": Setting("mpfr", 4, 4, "embedded", 0.0),
    "mpfr B=8 L=4": Setting("mpfr", 8, 4, "embedded", 0.0),
    # `wmark generate`'s defaults: mpfr, drafter auto, SamplerConfig's B, the CLI's L and confidence
    "default": Setting("mpfr", None, DEFAULT_LOOKAHEAD, "auto", DEFAULT_DRAFT_CONFIDENCE),
    "default drafter=embedded": Setting(
        "mpfr", None, DEFAULT_LOOKAHEAD, "embedded", DEFAULT_DRAFT_CONFIDENCE
    ),
    "default drafter=ngram": Setting("mpfr", None, DEFAULT_LOOKAHEAD, "ngram", DEFAULT_DRAFT_CONFIDENCE),
    # the default with the draft model's weights kept 8-bit (where the CPU would cut them to 4)
    "default int8 drafter": Setting("mpfr", None, DEFAULT_LOOKAHEAD, "auto@8", DEFAULT_DRAFT_CONFIDENCE),
    "default confidence=0": Setting("mpfr", None, DEFAULT_LOOKAHEAD, "auto", 0.0),
    # the default with the draft model reading the whole prompt (it reads the last MODEL_CONTEXT)
    "default whole-prompt drafter": Setting(
        "mpfr", None, DEFAULT_LOOKAHEAD, "auto~0", DEFAULT_DRAFT_CONFIDENCE
    ),
}
CLASSIC = ["basic-uwm", "pfr L=4", "pfr-nowm L=4", "mpfr B=2 L=4", "mpfr B=4 L=4", "mpfr B=8 L=4"]


@dataclass
class Row:
    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0
    draft_forwards: int = 0
    blocks: int = 0
    aatps: list[float] = field(default_factory=list)
    draft: float = 0.0
    verify: float = 0.0
    bookkeeping: float = 0.0
    prefill: float = 0.0
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    diverse: list[int] = field(default_factory=list)
    masked: list[int] = field(default_factory=list)


def parse_setting(name: str) -> Setting:
    """An ad hoc row: method:B:L:drafter:confidence[:lookup[:reach[:rows]]]."""
    method, b, ell, drafter_name, conf, *rest = name.split(":")
    lookup, reach, rows = [*rest, None, None, None][:3]
    return Setting(
        method,
        int(b),
        int(ell),
        drafter_name,
        float(conf),
        int(lookup) if lookup else None,
        float(reach) if reach else None,
        int(rows) if rows else None,
    )


def sampler_config(setting: Setting, tokens: int) -> SamplerConfig:
    given = {
        "drafts": setting.drafts,
        "lookahead": setting.lookahead,
        "draft_confidence": setting.confidence,
        "lookup_lookahead": setting.lookup,
        "min_reach": setting.reach,
        "max_rows": setting.rows,
    }
    return SamplerConfig(
        method=setting.method, max_new_tokens=tokens, **{k: v for k, v in given.items() if v is not None}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision",
        default="auto",
        help="the target's precision (default: what `wmark generate` takes on this CPU; the header "
        "says which; until 2026-12-07 it was int8 everywhere). With --kernels the precision stays this "
        "CPU's: pass int8-fast to time a CPU without AMX",
    )
    parser.add_argument("--skip-hf", action="store_true", help="skip the transformers generate() reference")
    parser.add_argument(
        "--prompt-sets",
        default=None,
        help="comma-separated prompt sets (e.g. eli5-mini,code-mini); default: 3 ELI5 prompts",
    )
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="request seeds per prompt (each gives another answer: the diversity prefix and the "
        "race's unkeyed positions follow the seed); prompt i runs with seeds i, i + 1000, ...",
    )
    parser.add_argument(
        "--kernels",
        default=None,
        help="comma-separated int8 GEMM builds to run every setting on, side by side (e.g. "
        "amx,avx512vnni; they give the same bits); default: the fastest this CPU runs",
    )
    parser.add_argument(
        "--settings",
        default=",".join(CLASSIC),
        help=f"comma-separated rows: {', '.join(SETTINGS)}, "
        "or method:B:L:drafter:confidence[:lookup[:reach[:rows]]] (drafter auto~N: the default "
        "hybrid with its model reading the prompt's last N tokens, 0: all of it)",
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.settings.split(",")]
    for name in names:
        if name not in SETTINGS and 4 <= name.count(":") <= 7:
            SETTINGS[name] = parse_setting(name)
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or "basic-uwm" not in names:
        parser.error(f"unknown settings {unknown} (basic-uwm is required: the ratios are against it)")

    if args.precision == "auto":
        args.precision = cpu_precision()
    pair = load_pair("embedded", "embedded", precision=args.precision, threads=args.threads)
    assert pair.drafter is not None
    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_bench",
        secret=Secret(hashlib.sha256(b"bench key").digest()),
        spec=WatermarkSpec(tokenizer=tok.ref),
    )
    # a name ending in "@8" keeps the draft model's int8 weights, on a copy taken first (the 4-bit
    # cut of the others is in place)
    wanted = {s.drafter for s in (SETTINGS[n] for n in names) if s.drafter is not None}
    drafters = {}
    # "auto~N": the default hybrid with its draft model reading the prompt's last N tokens (0: all)
    for d in sorted(wanted, key=lambda d: not d.endswith("@8")):
        name, eight = d.removesuffix("@8"), d.endswith("@8")
        name, _, context = name.partition("~")
        model = pair.drafter if drafter_model_source(name, "embedded") else None
        if eight and model is not None:
            model = copy.deepcopy(model)
        drafters[d] = build_drafter(name, pair.target, model, int4=False if eight else None)
        if context:
            assert isinstance(drafters[d], HybridDrafter), f"{d}: a context applies to the auto drafter"
            drafters[d] = HybridDrafter(drafters[d].model, context=int(context) or None)
    prompts: list[tuple[str, list[int]]] = []
    if args.prompt_sets:
        encode = prompt_encoder(pair, chat=True)
        for set_name in args.prompt_sets.split(","):
            prompts += [(set_name, encode(p)) for p in load_prompt_set(set_name, limit=args.limit).prompts]
    else:
        prompts = [("explanations", pair.encode_prompt(p)) for p in PROMPTS]
    hf_model = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(
            str(resolve_source("embedded", "target")), dtype=torch.float32
        )

    kernels = args.kernels.split(",") if args.kernels else [_int8_gemm.backend()]
    rows: dict[tuple[str, str], Row] = {}
    runs = [(i + 1000 * s, group, ids) for s in range(args.seeds) for i, (group, ids) in enumerate(prompts)]
    for (seed, set_name, ids), kernel in itertools.product(runs, kernels):
        _int8_gemm.use_backend(kernel)
        group = set_name if len(kernels) == 1 else f"{set_name} [{kernel}]"
        i = seed % 1000
        for name in names:  # methods alternate prompt by prompt
            setting = SETTINGS[name]
            drafter = drafters.get(setting.drafter) if setting.drafter else None
            out = generate(
                pair.target,
                ids,
                config=sampler_config(setting, args.tokens),
                key=key,
                drafter=drafter,
                seed=seed,
            )
            row = rows.setdefault((group, name), Row())
            row.tokens += len(out.token_ids)
            row.seconds += out.timings.total
            row.forwards += out.target_forwards
            row.draft_forwards += out.draft_forwards
            row.blocks += len(out.blocks)
            row.aatps.append(out.aatps)
            row.draft += out.timings.draft
            row.verify += out.timings.verify
            row.bookkeeping += out.timings.bookkeeping
            row.prefill += out.timings.prefill
            row.outputs.append(out.token_ids)
            row.diverse.append(len(out.diverse_positions))
            row.masked.append(len(out.masked_positions))
            print(
                f"  {name:>14} {group} prompt {i} seed {seed}: {len(out.token_ids)} tokens, "
                f"{out.tokens_per_s:.2f} tok/s, AATPS {out.aatps:.2f}",
                flush=True,
            )
        if hf_model is not None and kernel == kernels[0]:
            torch.manual_seed(seed)
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
            row = rows.setdefault((group, "transformers generate() fp32"), Row())
            n = gen.shape[1] - len(ids)
            row.tokens += n
            row.seconds += seconds
            row.forwards += n
            row.aatps.append(1.0)
            print(f"  transformers prompt {i}: {n} tokens, {n / seconds:.2f} tok/s", flush=True)
    _int8_gemm.use_backend(_int8_gemm.backends()[0])

    print()
    print(
        f"{len(prompts)} prompts x {args.seeds} seeds x {args.tokens} new tokens, "
        f"torch threads {args.threads}, precision {args.precision}"
    )
    print(machine.describe())
    for group in dict.fromkeys(g for g, _ in rows):
        _table(group, {name: row for (g, name), row in rows.items() if g == group})


def _table(group: str, rows: dict[str, Row]) -> None:
    """One prompt set's rows; c and r in units of basic-uwm's forward (the cost model).

    Prefill (the prompt, both models) is timed apart: tokens/s counts it (what a user waits
    for), "decode" does not (what speculation can speed up), and c and r exclude it.
    """
    base = rows["basic-uwm"]
    unit = base.verify / base.forwards  # seconds of one one-token target forward
    base_decode = base.tokens / (base.seconds - base.prefill)
    print()
    print(f"{group}: {len(base.outputs)} answers")
    print()
    print(
        "| method | tokens/s | vs basic-uwm | decode vs basic-uwm | prefill s | AATPS (mean ± sd) | "
        "target forwards | c (drafter forward) | L·c (draft per block) | r (verify per block) | "
        "AATPS / (L·c + r) | draft s | verify s | bookkeeping s | same tokens as basic-uwm | "
        "diversity / masked positions per answer |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        rate = row.tokens / row.seconds
        decode = row.tokens / (row.seconds - row.prefill) / base_decode if row.seconds > row.prefill else 0.0
        same = (
            "n/a"
            if not row.outputs or name == "pfr-nowm L=4"
            else f"{sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True))}/{len(row.outputs)}"
        )
        sd = statistics.stdev(row.aatps) if len(row.aatps) > 1 else 0.0
        blocks = row.blocks or row.forwards
        c = row.draft / row.draft_forwards / unit if row.draft_forwards else 0.0
        lc, r = row.draft / blocks / unit, row.verify / blocks / unit
        predicted = f"{statistics.mean(row.aatps) / (lc + r):.2f}x" if r else ""
        print(
            f"| {name} | {rate:.2f} | {rate / (base.tokens / base.seconds):.2f}x | {decode:.2f}x | "
            f"{row.prefill:.1f} | {statistics.mean(row.aatps):.2f} ± {sd:.2f} | {row.forwards} | "
            f"{c:.2f} | {lc:.2f} | {r:.2f} | "
            f"{predicted} | {row.draft:.1f} | {row.verify:.1f} | {row.bookkeeping:.1f} | {same} | "
            f"{statistics.mean(row.diverse or [0]):.1f} / {statistics.mean(row.masked or [0]):.1f} |"
        )


if __name__ == "__main__":
    main()
