"""The issue's acceptance checks on a `wmark eval` folder, as a markdown table.

    .venv/bin/python bench/eval_checks.py bench/out/eval-embedded

Every comparison is paired by (prompt, seed) unless stated, on the run's default drafter:

1. mpfr AATPS >= gls AATPS within one standard error at every (L, B): mean(mpfr - gls) >= -SE.
2. pfr ANLPPT-U within noise of basic-uwm: |mean difference| <= 2 SE (identical texts give 0).
3. mse ANLPPT-U clearly below pfr: paired one-sided t-test p < 0.01 at every L (the Wilcoxon
   signed-rank p and the ratio of means are printed beside it).
4. pfr-nowm and vsps: empirical FPR at alpha = 1% consistent with alpha (Clopper-Pearson 95%
   interval contains it), at the full length and pooled over T in {16, 32, 64}; and the detector on
   every distinct text under fresh keys.
5. LPPL of every method within noise of basic-uwm's: a paired two-sided t-test per setting, Holm-adjusted
   over all settings (about twenty), adjusted p > 0.05.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from scipy import stats

from wmark.eval.aggregate import ALPHA, calibration_other_keys, is_default, tpr
from wmark.eval.metrics import binomial_interval, log_p_at, standard_error
from wmark.eval.rows import EvalRow
from wmark.eval.runner import ResultsFile, RunInfo
from wmark.spec import WatermarkSpec


def _anlppt_u(row: EvalRow) -> float:
    return -row.log_p["u"] / row.n_scored if row.n_scored else math.nan


def _mean_anlppt(rows: list[EvalRow]) -> float:
    return float(np.nanmean([_anlppt_u(r) for r in rows]))


def _paired(a: list[EvalRow], b: list[EvalRow], value) -> np.ndarray:
    other = {(r.prompt_key, r.seed): value(r) for r in b}
    return np.array([value(r) - other[(r.prompt_key, r.seed)] for r in a if (r.prompt_key, r.seed) in other])


def _holm(p_values: list[float]) -> list[float]:
    """Holm step-down adjusted p-values, in input order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _select(rows: list[EvalRow], method: str, lookahead=None, drafts: int = 1) -> list[EvalRow]:
    return [r for r in rows if r.method == method and r.lookahead == lookahead and r.drafts == drafts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    info = RunInfo.load(args.folder / "run.json")
    everything = ResultsFile(args.folder / "results.jsonl").load()
    rows = [r for r in everything if is_default(r, info)]
    lines = ["| check | setting | figures | holds |", "|---|---|---|---|"]

    def add(check: str, setting: str, figures: str, ok: bool) -> None:
        lines.append(f"| {check} | {setting} | {figures} | {'yes' if ok else '**no**'} |")

    multi = sorted({(r.lookahead, r.drafts) for r in rows if r.method == "mpfr"})
    for ell, b in multi:
        mpfr, gls = _select(rows, "mpfr", ell, b), _select(rows, "gls", ell, b)
        if not gls:
            continue
        d = _paired(mpfr, gls, lambda r: r.aatps)
        se = standard_error(d)
        figures = (
            f"mpfr {np.mean([r.aatps for r in mpfr]):.3f}, gls {np.mean([r.aatps for r in gls]):.3f}; "
            f"diff {d.mean():+.3f}, SE {se:.3f} (n {len(d)})"
        )
        add("1. mpfr AATPS >= gls - 1 SE", f"L={ell} B={b}", figures, d.mean() >= -se)

    basic = _select(rows, "basic-uwm")
    for ell in sorted({r.lookahead for r in rows if r.method == "pfr"}):
        pfr = _select(rows, "pfr", ell)
        d = _paired(pfr, basic, _anlppt_u)
        same = int((_paired(pfr, basic, lambda r: hash(tuple(r.token_ids))) == 0).sum())
        se = standard_error(d)
        figures = (
            f"pfr {_mean_anlppt(pfr):.4f}, basic-uwm {_mean_anlppt(basic):.4f}; diff {d.mean():+.4f} "
            f"(SE {0.0 if math.isnan(se) else se:.4f}); identical texts {same}/{len(pfr)}"
        )
        add(
            "2. pfr ANLPPT-U ~ basic-uwm",
            f"L={ell}",
            figures,
            abs(d.mean()) <= 2 * (0.0 if math.isnan(se) else se),
        )
        mse = _select(rows, "mse", ell)
        if mse:
            d = _paired(pfr, mse, _anlppt_u)
            t = stats.ttest_1samp(d, 0.0, alternative="greater")
            w = stats.wilcoxon(d, alternative="greater").pvalue if d.any() else 1.0
            figures = (
                f"mse {_mean_anlppt(mse):.4f} vs pfr {_mean_anlppt(pfr):.4f} (ratio "
                f"{_mean_anlppt(mse) / _mean_anlppt(pfr):.2f}); pfr - mse {d.mean():+.4f} "
                f"(SE {standard_error(d):.4f}), paired t one-sided p = {t.pvalue:.1e} "
                f"(Wilcoxon {w:.1e}; pfr higher on {int((d > 0).sum())}/{len(d)} texts)"
            )
            add("3. mse ANLPPT-U clearly below pfr", f"L={ell}", figures, t.pvalue < 0.01)

    for method in ("pfr-nowm", "vsps", "gls"):
        mine = [r for r in rows if r.method == method]
        if not mine:
            continue
        full = binomial_interval(sum(r.log_p["aaronson"] <= math.log(ALPHA) for r in mine), len(mine))
        pooled_hits = sum(
            log_p_at(r.scored_positions, r.pivots, t)[0] <= math.log(ALPHA)
            for r in mine
            for t in (16, 32, 64)
        )
        pooled = binomial_interval(pooled_hits, 3 * len(mine))
        figures = (
            f"full length {full.k}/{full.n} [{full.low:.3f}, {full.high:.3f}]; "
            f"T in 16/32/64 pooled {pooled.k}/{pooled.n} [{pooled.low:.3f}, {pooled.high:.3f}]; "
            f"TPR@64 {tpr(mine, 64):.3f}"
        )
        add(
            "4. empirical FPR consistent with 1%",
            f"{method} (every setting)",
            figures,
            full.contains(ALPHA) and pooled.contains(ALPHA),
        )
    iv = calibration_other_keys(rows, WatermarkSpec.from_json(info.spec))
    add(
        "4. detector on every distinct text, fresh keys",
        "100 keys per text",
        f"{iv.k}/{iv.n} = {iv.rate:.4f} [{iv.low:.4f}, {iv.high:.4f}]",
        iv.contains(ALPHA),
    )

    comparisons = []
    for method in sorted({r.method for r in rows} - {"basic-uwm"}):
        for setting in sorted({(r.lookahead, r.drafts) for r in rows if r.method == method}):
            mine = _select(rows, method, *setting)
            d = _paired(mine, basic, lambda r: r.lppl)
            p = 1.0 if not d.any() else float(stats.ttest_1samp(d, 0.0).pvalue)
            comparisons.append((f"{method} L={setting[0]} B={setting[1]}", mine, d, p))
    adjusted = _holm([p for *_, p in comparisons])
    base = np.mean([r.lppl for r in basic])
    for (setting, mine, d, _), p_adj in zip(comparisons, adjusted, strict=True):
        ours = np.mean([r.lppl for r in mine])
        figures = f"LPPL {ours:.3f} vs {base:.3f}; diff {d.mean():+.3f} (SE {standard_error(d):.3f})"
        figures += f"; Holm p {p_adj:.2f}"
        add("5. LPPL ~ basic-uwm", setting, figures, p_adj > 0.05)

    prompts = len({r.prompt_key for r in rows})
    print(f"{len(everything)} rows ({len(rows)} with the default drafter), {prompts} prompts\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
