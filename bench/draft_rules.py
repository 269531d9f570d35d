"""Drafting settings compared by counting, not by the clock: noise-free A/Bs on a shared machine.

    WMARK_HOME=... OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/draft_rules.py \\
        --prompt-sets summaries-mini,code-mini --settings "default,mpfr:2:6:auto:0.5"

A setting's text is the target's race winners whatever the drafter does, so for a given prompt
and seed every setting emits the same tokens, and which forwards it runs (how many, over how
many rows) is a deterministic function of the setting. Only their seconds are noisy. This
script runs each setting, logs every forward of either model with its row count M (the
prompt's prefill apart), and prices the log with one cost table: the median milliseconds of an
M-row forward of each model after a 300-token prefix, measured once at the start in this
process. The predicted decode time (prefill excluded: it is the same for every setting but the
drafter's) then moves only with the counts, so two settings whose measured tokens/s differ by
less than this machine's drift (often ±10 % between runs) can still be told apart. The measured
seconds are printed beside it as a check of the table.

`--save-counts FILE` writes the counts themselves (per prompt set and setting: tokens, blocks
and a histogram of each model's forwards by row count): they do not depend on the machine, so
`bench/gpu_check.py --counts FILE` prices them with a GPU's own cost table.

Settings: `bench/generate_speed.py`'s names or method:B:L:drafter:confidence[:lookup[:reach[:rows]]].
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_speed import SETTINGS, Setting, parse_setting, sampler_config  # noqa: E402 (its rows)
from machine import describe  # noqa: E402

from wmark import KeyMaterial, Secret, WatermarkSpec  # noqa: E402
from wmark.detector import TextTokenizer  # noqa: E402
from wmark.eval.models import prompt_encoder  # noqa: E402
from wmark.eval.prompts import load_prompt_set  # noqa: E402
from wmark.generator.backend import LanguageModel, PrefillSession, Session  # noqa: E402
from wmark.generator.drafters.build import build_drafter, drafter_model_source  # noqa: E402
from wmark.generator.engine import generate  # noqa: E402
from wmark.generator.models.embedded import embedded_tokenizer_json  # noqa: E402
from wmark.generator.models.loading import load_pair  # noqa: E402
from wmark.generator.models.prepare import cpu_precision  # noqa: E402

ForwardLog = list[tuple[str, int]]  # (model role, rows M) of every forward that made logits


class CountingSession:
    """A session that logs each forward's row count: its queued committed tokens plus new nodes."""

    def __init__(self, inner: Session, role: str, log: ForwardLog) -> None:
        self.inner, self.role, self.log = inner, role, log

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    def prefill(self) -> None:
        if isinstance(self.inner, PrefillSession):
            self.inner.prefill()

    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        before = self.inner.forwards
        pending = len(getattr(self.inner, "pending", ()))
        out = self.inner.extend(parents, tokens)
        if self.inner.forwards > before:  # no forward when nothing was new (the root again)
            self.log.append((self.role, pending + len(tokens)))
        return out

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        self.inner.accept(path, extra)


@dataclass
class CountingModel:
    """`model` whose sessions log their forwards into `log` under `role`."""

    model: LanguageModel
    role: str
    log: ForwardLog = field(default_factory=list)

    def __getattr__(self, name: str) -> object:  # vocab_size, eos_token_ids, tokenizer_sha256, ...
        return getattr(self.model, name)

    def session(self, prompt_ids: Sequence[int]) -> CountingSession:
        return CountingSession(self.model.session(prompt_ids), self.role, self.log)


def cost_table(model: LanguageModel, ids: Sequence[int], sizes: range, rounds: int) -> dict[int, float]:
    """Median ms of one forward over M new tokens (a chain) after a 300-token prefix, per M."""
    session = model.session(ids[:300])
    session.extend([], [])
    session.accept([], [])
    table = {}
    for m in sizes:
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            session.extend(list(range(-1, m - 1)), ids[300 : 300 + m])
            times.append(time.perf_counter() - start)
            session.accept([], [])
        table[m] = 1000 * statistics.median(times)
    return table


def price(log: ForwardLog, tables: dict[str, dict[int, float]]) -> float:
    """Predicted seconds of the logged forwards; past the table, linear in M from its last entry."""
    total = 0.0
    for role, m in log:
        table = tables[role]
        top = max(table)
        total += table[m] if m in table else table[top] * m / top
    return total / 1000


@dataclass
class Tally:
    tokens: int = 0
    blocks: int = 0
    drafter_forwards: int = 0
    verify_rows: int = 0
    predicted: float = 0.0
    measured: float = 0.0
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    rows: dict[str, dict[int, int]] = field(default_factory=lambda: {"target": {}, "drafter": {}})


def save_counts(path: Path, tallies: dict[tuple[str, str], Tally], args: argparse.Namespace) -> None:
    """Each (prompt set, setting)'s tokens and forwards as JSON: which forwards a setting runs
    does not depend on the machine (the text is the target's), only their cost does, so another
    machine prices these counts with its own cost table (`bench/gpu_check.py --counts`)."""
    counts = {
        "made_by": f"bench/draft_rules.py --prompt-sets {args.prompt_sets} --settings {args.settings!r} "
        f"--tokens {args.tokens} --precision {args.precision}"
        + (f" --limit {args.limit}" if args.limit else ""),
        "date": time.strftime("%Y-%m-%d"),
        "sets": {},
    }
    for (set_name, name), t in tallies.items():
        counts["sets"].setdefault(set_name, {})[name] = {
            "tokens": t.tokens,
            "blocks": t.blocks,
            "forwards": {role: {str(m): n for m, n in sorted(h.items())} for role, h in t.rows.items()},
        }
    path.write_text(json.dumps(counts, indent=1) + "\n")
    print(f"counts written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-sets", default="summaries-mini,code-mini")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    parser.add_argument("--settings", default="default")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision",
        default="auto",
        help="the target's precision (default: what `wmark generate` takes on this CPU; until "
        "2026-12-07 int8 everywhere): the texts, hence the counts, follow it",
    )
    parser.add_argument("--rounds", type=int, default=7, help="timed forwards per cost-table entry")
    parser.add_argument(
        "--save-counts",
        type=Path,
        default=None,
        help="write each setting's forwards per prompt set (a histogram of row counts per model) "
        "as JSON, for pricing on another machine (bench/gpu_check.py --counts)",
    )
    args = parser.parse_args()
    names = ["basic-uwm", *(n.strip() for n in args.settings.split(",") if n.strip() != "basic-uwm")]
    unknown = [n for n in names if n not in SETTINGS and not 4 <= n.count(":") <= 7]
    if unknown:
        parser.error(f"unknown settings {unknown}")
    settings: dict[str, Setting] = {n: SETTINGS[n] if n in SETTINGS else parse_setting(n) for n in names}
    if any(s.drafter is not None and s.drafter.endswith("@8") for s in settings.values()):
        parser.error("8-bit drafter rows are generate_speed.py's; this script prices one drafter build")

    if args.precision == "auto":
        args.precision = cpu_precision()
    pair = load_pair("embedded", "embedded", precision=args.precision, threads=args.threads)
    assert pair.drafter is not None
    log: ForwardLog = []
    target = CountingModel(pair.target, "target", log)
    counted_drafter = CountingModel(pair.drafter, "drafter", log)
    drafters = {}
    for name in {s.drafter for s in settings.values() if s.drafter is not None}:
        model = pair.drafter if drafter_model_source(name, "embedded") else None
        built = build_drafter(name, pair.target, model)
        # count the draft model's forwards wherever it sits (alone, or inside the hybrid)
        if built is pair.drafter:
            built = counted_drafter
        elif getattr(built, "model", None) is pair.drafter:
            built.model = counted_drafter  # type: ignore[attr-defined]
        drafters[name] = built
    if pair.drafter.plan.decoder is not None:
        pair.drafter.plan.decoder.tuner = None  # fixed threads: the table must price what the runs do

    ids = pair.encode_prompt("Summarise in detail how photosynthesis works, step by step. " * 30)
    tables = {
        "target": cost_table(pair.target, ids, range(1, 17), args.rounds),
        "drafter": cost_table(pair.drafter, ids, range(1, 11), args.rounds),
    }
    for role, table in tables.items():
        print(f"cost table, {role} (ms per forward of M = 1, 2, ...):", [round(t, 1) for t in table.values()])

    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_bench",
        secret=Secret(hashlib.sha256(b"bench key").digest()),
        spec=WatermarkSpec(tokenizer=tok.ref),
    )
    encode = prompt_encoder(pair, chat=True)
    tallies: dict[tuple[str, str], Tally] = {}
    for set_name in args.prompt_sets.split(","):
        for i, prompt in enumerate(load_prompt_set(set_name, limit=args.limit).prompts):
            prompt_ids = encode(prompt)
            for name, setting in settings.items():
                log.clear()
                out = generate(
                    target,
                    prompt_ids,
                    config=sampler_config(setting, args.tokens),
                    key=key,
                    drafter=drafters.get(setting.drafter) if setting.drafter else None,
                    seed=i,
                )
                tally = tallies.setdefault((set_name, name), Tally())
                tally.tokens += len(out.token_ids)
                tally.blocks += len(out.blocks)
                tally.drafter_forwards += sum(1 for role, _ in log if role == "drafter")
                tally.verify_rows += sum(m for role, m in log if role == "target")
                tally.predicted += price(log, tables)
                tally.measured += out.timings.decode
                tally.outputs.append(out.token_ids)
                for role, m in log:
                    tally.rows[role][m] = tally.rows[role].get(m, 0) + 1
            print(f"  {set_name} prompt {i} done", flush=True)
    if args.save_counts is not None:
        save_counts(args.save_counts, tallies, args)

    print()
    print(f"{describe()}, precision {args.precision}")
    print(
        "| set | setting | AATPS | drafter forwards / block | target rows / verify | predicted decode s | "
        "predicted decode vs basic-uwm | measured decode s (vs basic-uwm) | same tokens as basic-uwm |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for set_name in dict.fromkeys(s for s, _ in tallies):
        base = tallies[(set_name, "basic-uwm")]
        for (group, name), t in tallies.items():
            if group != set_name:
                continue
            same = sum(a == b for a, b in zip(t.outputs, base.outputs, strict=True))
            print(
                f"| {set_name} | {name} | {t.tokens / t.blocks:.2f} | {t.drafter_forwards / t.blocks:.2f} | "
                f"{t.verify_rows / t.blocks:.2f} | {t.predicted:.1f} | {base.predicted / t.predicted:.3f}x | "
                f"{t.measured:.1f} ({base.measured / t.measured:.2f}x) | {same}/{len(t.outputs)} |"
            )


if __name__ == "__main__":
    main()
