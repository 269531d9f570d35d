"""`wmark eval` on the embedded pair (Qwen2.5-Coder 1.5B target, 0.5B drafter), CPU int8, in stages.

    WMARK_MODEL_CACHE=build/test-models nice -n 19 .venv/bin/python bench/eval_embedded.py [--stage all]

All stages write into one folder (bench/out/eval-embedded, resumable: rerun to continue):

- main: every method at L=4; mpfr and gls at B = 2, 4, 6, 8 (the acceptance checks, Table 1);
- frontier: the single-draft methods at L = 1 and 2 as well (the frontier plot's other points);
- drafters: pfr, mpfr (B=4), mse, mse-pseudo at L=4 with the drafter substituted: the embedded
  drafter at temperature 0.5 and 1.5, and the target itself drafting (Figure 2b's D0-D3).
- power: 5 prompts of each set instead of --limit for basic-uwm, pfr, mse, pfr-nowm and vsps
  (L=4), and pfr and mse at L=1 and 2: the paired ANLPPT checks and the FPR check need more texts.

Then summary.md and the plots are rebuilt from every row and copied to bench/results/eval/, and
bench/eval_checks.py prints the acceptance checks. The size (prompts, tokens) is set by --limit and
--tokens: on this shared 2-core CPU one 64-token generation takes about a minute.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SINGLE = "vsps,pfr-nowm,mws,mse,mse-pseudo,pfr"
STAGES = {
    "main": ["--methods", f"basic-uwm,{SINGLE},mpfr,gls", "--lookahead", "4", "--drafts", "2,4,6,8"],
    "frontier": ["--methods", SINGLE, "--lookahead", "1,2"],
    "drafters": [
        [
            "--methods",
            "pfr,mpfr,mse,mse-pseudo",
            "--lookahead",
            "4",
            "--drafts",
            "4",
            "--draft-temperature",
            "0.5,1.5",
        ],
        ["--methods", "pfr,mpfr,mse,mse-pseudo", "--lookahead", "4", "--drafts", "4", "--drafter", "target"],
    ],
    "power": [  # more prompts where the checks compare small per-text differences (the last --limit wins)
        ["--limit", "5", "--methods", "basic-uwm,pfr,mse,pfr-nowm,vsps", "--lookahead", "4"],
        ["--limit", "5", "--methods", "pfr,mse", "--lookahead", "1,2"],
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=[*STAGES, "all", "summary"], default="all")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "eval-embedded")
    parser.add_argument("--limit", type=int, default=2, help="prompts of each built-in set (x3 sets)")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    common = ["--out", str(args.out), "--prompts", "builtin", "--limit", str(args.limit)]
    common += ["--max-new-tokens", str(args.tokens), "--no-plots"]
    stages = list(STAGES) if args.stage == "all" else [] if args.stage == "summary" else [args.stage]
    for stage in stages:
        runs = STAGES[stage]
        for extra in runs if isinstance(runs[0], list) else [runs]:
            print(f"== {stage}: {' '.join(extra)}", flush=True)
            subprocess.run([sys.executable, "-m", "wmark.cli", "eval", *common, *extra], check=True)
    subprocess.run([sys.executable, "-m", "wmark.cli", "eval", *common[:-1], "--summary-only"], check=True)
    results = ROOT / "bench" / "results" / "eval"
    results.mkdir(parents=True, exist_ok=True)
    for name in ("summary.md", "frontier.png", "multidraft.png", "tpr.png", "drafters.png"):
        if (args.out / name).exists():
            shutil.copy(args.out / name, results / name)
    subprocess.run([sys.executable, str(ROOT / "bench" / "eval_checks.py"), str(args.out)], check=True)


if __name__ == "__main__":
    main()
