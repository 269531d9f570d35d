"""summary.md: the run's tables, in the shapes of the paper's tables.

- per-L single-draft tables (Tables 2-5): AATPS, token rate, ANLPPT under U / Aaronson / Li /
  PL, TPR at 1% FPR, LPPL, ROUGE-L, one row per method;
- the multi-draft table (Table 1): MPFR vs GLS AATPS per B, the better one in bold, with the
  paired difference and its standard error;
- TPR at 1% FPR vs the number of evaluated tokens (Figure 2a), with the empirical FPR of the
  unwatermarked methods beside it; the same TPR under the analytic threshold and under empirical
  ones (the run's unwatermarked texts; a negative corpus, `wmark.eval.negatives`) side by side;
  and the H0 calibration of the detector;
- mse-pseudo's tau: fixed 0.5 and fitted on training splits;
- the drafter-substitution ablation (Figure 2b): AATPS per drafter, TPR drift, text drift;
- Hu & Huang's pooled conventions for the same runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from wmark.eval.aggregate import (
    ALPHA,
    EVAL_TOKENS,
    GroupStats,
    SettingKey,
    ablation_groups,
    calibration_other_keys,
    empirical_threshold,
    group_rows,
    group_stats,
    is_default,
    method_rank,
    row_log_p,
    tau_fits,
    text_drift,
    tpr,
)
from wmark.eval.detection import DEFAULT_TAU
from wmark.eval.metrics import binomial_interval, standard_error
from wmark.eval.rows import EvalRow
from wmark.eval.runner import RunInfo
from wmark.generator.engine import METHODS
from wmark.scoring import ScoreName
from wmark.spec import WatermarkSpec

if TYPE_CHECKING:
    from wmark.eval.negatives import NegativeThresholds

__all__ = ["eval_tokens", "headline_groups", "headline_tokens", "paired_differences", "render_summary"]

SCORE_COLUMNS: tuple[tuple[ScoreName, str], ...] = (("u", "U"), ("aaronson", "A"), ("li", "Li"), ("pl", "PL"))


def _pm(value: tuple[float, float], digits: int = 3) -> str:
    mean, std = value
    return "-" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def headline_tokens(info: RunInfo) -> int:
    """T of the TPR column in the per-L tables: 64, or the budget when it is smaller."""
    return min(64, info.max_new_tokens)


def eval_tokens(info: RunInfo) -> list[int]:
    """The T values of the TPR-vs-tokens tables: `EVAL_TOKENS` within the budget (or the budget)."""
    return [t for t in EVAL_TOKENS if t <= info.max_new_tokens] or [info.max_new_tokens]


def render_summary(
    rows: Sequence[EvalRow], info: RunInfo, spec: WatermarkSpec, negatives: NegativeThresholds | None = None
) -> str:
    """The whole summary.md for the rows of one run (`negatives`: thresholds from a negative corpus)."""
    default = [r for r in rows if is_default(r, info)]
    parts = [_header(rows, info), _single_draft(default, info), _multi_draft(default)]
    parts += [_tpr_curves(default, info, negatives), _calibration(rows, spec), _pseudo_tau(default, info)]
    parts += [_ablation(rows, info), _pooled(default), _notes(info)]
    return "\n".join(p for p in parts if p)


def _header(rows: Sequence[EvalRow], info: RunInfo) -> str:
    prompts = len({r.prompt_key for r in rows})
    seeds = sorted({r.seed for r in rows})
    drafters = sorted({(r.drafter, r.draft_temperature) for r in rows if r.drafter is not None})
    conditions = ", ".join(f"{d} (T={t:g})" for d, t in drafters) or "-"
    return (
        "# wmark eval summary\n\n"
        f"- target: `{info.target}`; drafters: {conditions}; default drafter: "
        f"{info.default_drafter} (T={info.default_draft_temperature:g})\n"
        f"- prompts: {info.prompts} ({prompts} prompts, template {info.prompt_template}), seeds {seeds}, "
        f"{len(rows)} generations\n"
        f"- key {info.key_id} (fingerprint {info.key_fingerprint}); max_new_tokens {info.max_new_tokens}; "
        f"temperature {info.temperature:g}, top-k {info.top_k}, top-p {info.top_p:g}; "
        f"diversity bits {info.diversity_bits:g}\n"
        "- every cell: mean ± std over texts (prompts x seeds)\n"
    )


def _table_rows(groups: dict[SettingKey, list[EvalRow]]) -> list[tuple[GroupStats, list[EvalRow], bool]]:
    """(stats, rows, k1_only) per table line; mse-pseudo also gets a [k1 only] line."""
    out = []
    for key in sorted(groups, key=lambda k: method_rank(k[0])):
        for k1_only in (False, True) if key[0] == "mse-pseudo" else (False,):
            out.append((group_stats(groups[key], k1_only=k1_only), groups[key], k1_only))
    return out


def _rule(header: str) -> str:
    """The markdown separator line under `header`."""
    return "|" + "---|" * (header.count("|") - 1)


def _method_cell(s: GroupStats) -> str:
    return s.label if s.keyed else f"{s.label} †"


def _single_draft(rows: Sequence[EvalRow], info: RunInfo) -> str:
    singles = [r for r in rows if r.method in METHODS and not METHODS[r.method].multi_draft]
    lookaheads = sorted({r.lookahead for r in singles if r.lookahead is not None})
    if not singles:
        return ""
    t = headline_tokens(info)
    out = ["## Single draft (per L)\n"]
    head = "| method | n | AATPS | tokens/s | " + " | ".join(f"ANLPPT-{c}" for _, c in SCORE_COLUMNS)
    head += f" | TPR@{t} | LPPL | ROUGE-L |"
    ells: list[int | None] = [*lookaheads] or [None]
    for ell in ells:
        groups = group_rows(r for r in singles if r.lookahead in (ell, None))
        out += [f"### L = {ell}\n" if ell else "", head, _rule(head)]
        for s, mine, k1_only in _table_rows(groups):
            anl = " | ".join(_pm(s.anlppt[k]) for k, _ in SCORE_COLUMNS)
            out.append(
                f"| {_method_cell(s)} | {s.n} | {_pm(s.aatps, 2)} | {_pm(s.tokens_per_s, 2)} | {anl} | "
                f"{_rate(tpr(mine, t, k1_only=k1_only))} | {_pm(s.lppl)} | {_pm(s.rouge_l)} |"
            )
        out.append("")
    out.append("† unwatermarked: its TPR column is the empirical false-positive rate of the detector.\n")
    return "\n".join(out)


def _multi_draft(rows: Sequence[EvalRow]) -> str:
    multi = [r for r in rows if r.method in ("mpfr", "gls")]
    if not multi:
        return ""
    out = ["## Multi-draft: MPFR vs GLS (Table 1 shape)\n"]
    for ell in sorted({r.lookahead for r in multi if r.lookahead is not None}):
        out += [
            f"### L = {ell}\n",
            "| B | MPFR AATPS | GLS AATPS | MPFR − GLS (paired) | MPFR tokens/s | GLS tokens/s | "
            "MPFR ANLPPT-U | GLS ANLPPT-U | MPFR LPPL | GLS LPPL |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for b in sorted({r.drafts for r in multi if r.lookahead == ell}):
            out.append(_multi_line(b, *(_setting(multi, m, ell, b) for m in ("mpfr", "gls"))))
        out.append("")
    return "\n".join(out)


def _setting(rows: Sequence[EvalRow], method: str, lookahead: int, drafts: int) -> list[EvalRow]:
    return [r for r in rows if (r.method, r.lookahead, r.drafts) == (method, lookahead, drafts)]


def _multi_line(drafts: int, mpfr: list[EvalRow], gls: list[EvalRow]) -> str:
    """One B of the multi-draft table; the larger mean AATPS in bold."""
    stats = [group_stats(rows) if rows else None for rows in (mpfr, gls)]
    aatps = [_pm(s.aatps, 2) if s else "-" for s in stats]
    diff = "-"
    if stats[0] and stats[1]:
        best = 0 if stats[0].aatps[0] >= stats[1].aatps[0] else 1
        aatps[best] = f"**{aatps[best]}**"
        d = paired_differences(mpfr, gls)
        if d:
            diff = f"{np.mean(d):+.2f} (SE {standard_error(d):.2f}, n {len(d)})"
    cells = [
        (_pm(s.tokens_per_s, 2), _pm(s.anlppt["u"]), _pm(s.lppl)) if s else ("-", "-", "-") for s in stats
    ]
    return (
        f"| {drafts} | {aatps[0]} | {aatps[1]} | {diff} | {cells[0][0]} | {cells[1][0]} | "
        f"{cells[0][1]} | {cells[1][1]} | {cells[0][2]} | {cells[1][2]} |"
    )


def paired_differences(a: Sequence[EvalRow], b: Sequence[EvalRow], field: str = "aatps") -> list[float]:
    """a's minus b's `field`, matched by prompt and seed."""
    other = {(r.prompt_key, r.seed): float(getattr(r, field)) for r in b}
    return [
        float(getattr(r, field)) - other[(r.prompt_key, r.seed)] for r in a if (r.prompt_key, r.seed) in other
    ]


def headline_groups(rows: Sequence[EvalRow]) -> list[list[EvalRow]]:
    """One setting per method for curves: the largest L (and the largest B for multi-draft ones)."""
    out = []
    for method in sorted({r.method for r in rows}, key=method_rank):
        mine = [r for r in rows if r.method == method]
        ell = max((r.lookahead or 0) for r in mine)
        b = max(r.drafts for r in mine if (r.lookahead or 0) == ell)
        out.append([r for r in mine if (r.lookahead or 0) == ell and r.drafts == b])
    return out


def _label(rows: Sequence[EvalRow]) -> str:
    r = rows[0]
    if r.lookahead is None:
        return str(r.method)
    drafts = f", B={r.drafts}" if r.drafts > 1 else ""
    return f"{r.method} (L={r.lookahead}{drafts})"


def _tpr_curves(rows: Sequence[EvalRow], info: RunInfo, negatives: NegativeThresholds | None) -> str:
    if not rows:
        return ""
    tokens = eval_tokens(info)
    out = [
        f"## TPR at {ALPHA:.0%} FPR vs evaluated tokens (exact Aaronson Gamma test)\n",
        "| method | n | " + " | ".join(f"T={t}" for t in tokens) + " |",
        "|---|---" + "|---" * len(tokens) + "|",
    ]
    for group in headline_groups(rows):
        variants = [False, True] if group[0].method == "mse-pseudo" else [False]
        for k1_only in variants:
            label = _label(group) + (" [k1 only]" if k1_only else "")
            label += "" if group[0].keyed else " † (FPR)"
            cells = " | ".join(_rate(tpr(group, t, k1_only=k1_only)) for t in tokens)
            out.append(f"| {label} | {len(group)} | {cells} |")
    out.append(
        "\n† unwatermarked: the same detector and key; the rate is its empirical false-positive rate.\n"
    )
    return "\n".join(out) + _empirical_tpr(rows, tokens, negatives)


def _empirical_tpr(rows: Sequence[EvalRow], tokens: list[int], negatives: NegativeThresholds | None) -> str:
    """TPR under the analytic threshold and thresholds calibrated on the run's unwatermarked rows
    and on a negative corpus, side by side (a "–" where a threshold is missing)."""
    plain = [r for r in rows if not r.keyed]
    if not plain and negatives is None:
        return ""
    nan = math.nan
    run = {t: empirical_threshold([row_log_p(r, t) for r in plain]) if plain else nan for t in tokens}
    corpus = {t: negatives.token_level.get(t, nan) if negatives else nan for t in tokens}
    counts = {t: negatives.counts.get(t, 0) if negatives else 0 for t in tokens}
    source = f"the corpus {negatives.source}" if negatives else "no corpus given"

    def log10(x: float) -> str:
        return "–" if math.isnan(x) else f"{x / math.log(10):.2f}"

    out = [
        f"\n### TPR at {ALPHA:.0%} FPR: analytic / empirical on the run's {len(plain)} unwatermarked "
        f"texts / empirical on {source}\n",
        "| method | n | " + " | ".join(f"T={t}" for t in tokens) + " |",
        "|---|---" + "|---" * len(tokens) + "|",
        "| threshold (log10 p) | | "
        + " | ".join(f"{math.log10(ALPHA):.2f} / {log10(run[t])} / {log10(corpus[t])}" for t in tokens)
        + " |",
        "| negatives | | " + " | ".join(f"– / {len(plain)} / {counts[t]}" for t in tokens) + " |",
    ]
    for group in headline_groups([r for r in rows if r.keyed]):
        cells = []
        for t in tokens:
            log_ps = [row_log_p(r, t) for r in group]
            rates = [sum(lp <= math.log(ALPHA) for lp in log_ps) / len(log_ps)]
            rates += [
                nan if math.isnan(x) else sum(lp < x for lp in log_ps) / len(log_ps)
                for x in (run[t], corpus[t])
            ]
            cells.append(" / ".join("–" if math.isnan(x) else f"{x:.2f}" for x in rates))
        out.append(f"| {_label(group)} | {len(group)} | " + " | ".join(cells) + " |")
    out.append(
        "\nEmpirical threshold: the (k+1)-th smallest ln p of n negatives, k = floor(alpha n); a text is "
        "flagged when its ln p is strictly below it (at most k negatives are: the (1 - alpha) quantile of "
        f"-ln p). Its resolution is 1/n: with fewer than {1 / ALPHA:.0f} negatives it is their smallest "
        "p-value (an empirical FPR of 0). The corpus's negatives at T are its documents of at least T "
        f"tokens, cut to T (no threshold from fewer than {1 / ALPHA:.0f}), scored as the answers are "
        "(token-level Gamma test, no prompt in front).\n"
    )
    return "\n".join(out)


def _calibration(rows: Sequence[EvalRow], spec: WatermarkSpec) -> str:
    if not rows:
        return ""
    out = [
        f"## Calibration under H0 (alpha = {ALPHA:g})\n",
        "| texts | n | p <= alpha | rate | 95% interval | consistent with alpha |",
        "|---|---|---|---|---|---|",
    ]
    controls = [r for r in rows if not r.keyed]
    for name in sorted({r.method for r in controls}, key=method_rank):
        mine = [r for r in controls if r.method == name]
        hits = sum(r.log_p["aaronson"] <= math.log(ALPHA) for r in mine)
        iv = binomial_interval(hits, len(mine))
        out.append(
            f"| {name}, full length, watermark key | {iv.n} | {iv.k} | {iv.rate:.3f} | "
            f"[{iv.low:.3f}, {iv.high:.3f}] | {'yes' if iv.contains(ALPHA) else 'NO'} |"
        )
    keys = 100
    iv = calibration_other_keys(rows, spec, keys=keys)
    out.append(
        f"| every distinct text, {keys} keys it was not made with | {iv.n} | {iv.k} | {iv.rate:.4f} | "
        f"[{iv.low:.4f}, {iv.high:.4f}] | {'yes' if iv.contains(ALPHA) else 'NO'} |"
    )
    out.append("")
    return "\n".join(out)


def _pseudo_tau(rows: Sequence[EvalRow], info: RunInfo) -> str:
    pseudo = [r for r in rows if r.method == "mse-pseudo"]
    if len(pseudo) < 2:
        return ""
    group = headline_groups(pseudo)[0]
    tokens = sorted({headline_tokens(info), info.max_new_tokens})
    fits = tau_fits(group, tokens)
    out = [
        f"## mse-pseudo detector: tau ({_label(group)})\n",
        "Mixed pivot U2 where r > tau, else U1. Fitted tau: grid of 101 values in [0, 1] chosen on a "
        "random half of the texts (most detections, then most evidence), TPR measured on the other half; "
        "10 splits.\n",
        f"| T | k1 only | tau = {DEFAULT_TAU:g} | fitted tau: held-out TPR | fitted tau (median, range) |",
        "|---|---|---|---|---|",
    ]
    for t in tokens:
        fit = fits[t]
        out.append(
            f"| {t} | {_rate(tpr(group, t, k1_only=True))} | {_rate(tpr(group, t))} | "
            f"{np.mean(fit.tpr):.2f} ± {np.std(fit.tpr, ddof=1):.2f} | "
            f"{np.median(fit.taus):.2f} ({min(fit.taus):.2f}-{max(fit.taus):.2f}) |"
        )
    out.append("")
    return "\n".join(out)


def _ablation(rows: Sequence[EvalRow], info: RunInfo) -> str:
    groups = ablation_groups(rows)
    if not groups:
        return ""
    t_cols = [t for t in (64, 128) if t <= info.max_new_tokens] or [info.max_new_tokens]
    default = (info.default_drafter, info.default_draft_temperature)
    out = [
        "## Drafter substitution (same target, key, prompts and seeds)\n",
        "Text = default: texts identical to the default drafter's, matched by prompt and seed; "
        "ROUGE-L against that text. PFR/MPFR must not change the text at all.\n",
        "| method | drafter | n | AATPS | "
        + " | ".join(f"TPR@{t}" for t in t_cols)
        + " | text = default | ROUGE-L vs default |",
        "|---|---|---|---|" + "---|" * len(t_cols) + "---|---|",
    ]
    drift_lines = []
    for (method, ell, b), conditions in sorted(
        groups.items(), key=lambda kv: (method_rank(kv[0][0]), kv[0][1:])
    ):
        name = f"{method} (L={ell}{f', B={b}' if b > 1 else ''})"
        base = conditions.get(default)
        tprs: dict[int, list[float]] = {t: [] for t in t_cols}
        for cond in sorted(conditions, key=lambda c: (c != default, c)):
            mine = conditions[cond]
            rates = {t: tpr(mine, t) for t in t_cols}
            for t in t_cols:
                tprs[t].append(rates[t])
            if base is not None and cond != default:
                differ, n, rouge = text_drift(base, mine)
                same, rouge_cell = f"{n - differ}/{n}", f"{rouge:.3f}"
            else:
                same, rouge_cell = "(default)" if cond == default else "-", "-"
            aatps = group_stats(mine).aatps
            out.append(
                f"| {name} | {cond[0]} T={cond[1]:g} | {len(mine)} | {_pm(aatps, 2)} | "
                + " | ".join(_rate(rates[t]) for t in t_cols)
                + f" | {same} | {rouge_cell} |"
            )
        drift = ", ".join(f"T={t}: {100 * (max(v) - min(v)):.1f} points" for t, v in tprs.items())
        drift_lines.append(f"- {name}: TPR drift across drafters {drift}")
    return "\n".join([*out, "", *drift_lines, ""])


def _pooled(rows: Sequence[EvalRow]) -> str:
    if not rows:
        return ""
    out = [
        "## Hu & Huang's pooled conventions (same runs)\n",
        "Pooled AATPS: mean block length over all blocks of all texts. Pooled ANLPPT-U: sum of -ln p "
        "over texts / sum of generated tokens (masked ones included).\n",
        "| method | pooled AATPS | pooled ANLPPT-U |",
        "|---|---|---|",
    ]
    for group in headline_groups(rows):
        s = group_stats(group)
        out.append(f"| {_label(group)} | {s.pooled_aatps:.3f} | {s.pooled_anlppt_u:.4f} |")
    out.append("")
    return "\n".join(out)


def _notes(info: RunInfo) -> str:
    return (
        "## Definitions\n\n"
        "- AATPS: emitted tokens / target verification forwards, per text (the prompt prefill is not "
        "counted).\n"
        "- ANLPPT-s: -ln p / n_scored per text under score s (U, Aaronson, Li, PL; Aaronson exact, the "
        "others Chernoff bounds). Texts are scored with the prompt in front, at exactly the positions the "
        "generator keyed (repeated windows excluded).\n"
        "- Every method is scored with the watermark key's pivots U(y, 1) (the detector of the DeltaGumbel "
        "family and of PFR/MPFR); mse-pseudo with its mixed two-key pivot (tau = 0.5) and, for reference, "
        "[k1 only].\n"
        f"- TPR@T: share of texts whose first T generated tokens give p <= {ALPHA:g} (exact Gamma test).\n"
        "- LPPL: mean -ln P(y_t | prefix) under the processed target distribution, one target forward per "
        "text.\n"
        "- ROUGE-L: LCS F1 on token IDs against the reference, tokenised with the same tokenizer.\n"
        f"- tokens/s: this machine's generation rate (diagnostic only); budget {info.max_new_tokens} "
        "tokens.\n"
    )
