"""The run's figures as PNG files (matplotlib, Agg backend; the `eval` extra).

- frontier.png: the single-draft frontier, AATPS vs ANLPPT-U, one curve per method through its
  L values (paper Figure 1), error bars one standard error;
- multidraft.png: AATPS vs B for mpfr and gls at each L;
- tpr.png: TPR at 1% FPR vs evaluated tokens (Figure 2a), unwatermarked methods dashed (their
  empirical FPR), alpha as a dotted line;
- drafters.png: AATPS per drafter condition for each method (Figure 2b's setting), when the
  run has more than one drafter condition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wmark.errors import InputError
from wmark.eval.aggregate import (
    ALPHA,
    EVAL_TOKENS,
    ablation_groups,
    group_stats,
    is_default,
    method_rank,
    tpr,
)
from wmark.eval.metrics import standard_error
from wmark.eval.rows import EvalRow
from wmark.eval.runner import RunInfo
from wmark.eval.summary import headline_groups
from wmark.generator.engine import METHODS

__all__ = ["pyplot", "write_plots"]

_MARKERS = ("o", "v", "^", "s", "D", "P", "X", "*", "h")


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg back end, or a clear error without the `[eval]` extra."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'wmark[eval]' (or use --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(rows: Sequence[EvalRow], info: RunInfo, out: Path) -> list[Path]:
    """Write every figure the rows allow into `out`; returns the files written."""
    plt = pyplot()
    default = [r for r in rows if is_default(r, info)]
    written = []
    for name, draw in (
        ("frontier.png", _frontier),
        ("multidraft.png", _multidraft),
        ("tpr.png", _tpr),
        ("drafters.png", _drafters),
    ):
        fig, ax = plt.subplots(figsize=(7.2, 4.6), dpi=110)
        if draw(ax, rows if name == "drafters.png" else default, info):
            fig.tight_layout()
            fig.savefig(out / name)
            written.append(out / name)
        plt.close(fig)
    return written


def _frontier(ax: Any, rows: Sequence[EvalRow], info: RunInfo) -> bool:
    del info
    singles = [r for r in rows if r.method in METHODS and not METHODS[r.method].multi_draft]
    if not singles:
        return False
    for method in sorted({r.method for r in singles}, key=method_rank):
        points = []
        for ell in sorted({r.lookahead for r in singles if r.method == method}, key=lambda x: x or 0):
            mine = [r for r in singles if r.method == method and r.lookahead == ell]
            s = group_stats(mine)
            anl = [-getattr(r, _log_p_field(r))["u"] / r.n_scored for r in mine if r.n_scored]
            points.append((s.aatps[0], s.anlppt["u"][0], s.aatps_se, standard_error(anl), ell))
        xs, ys, xe, ye, ells = zip(*points, strict=True)
        dashed = not METHODS[method].keyed
        line = ax.errorbar(
            xs,
            ys,
            xerr=_nan0(xe),
            yerr=_nan0(ye),
            marker=_MARKERS[method_rank(method) % len(_MARKERS)],
            markersize=9 if method == "mws" else 6,
            markerfacecolor="none" if method == "mws" else None,  # mws sits on pfr: keep both visible
            capsize=2,
            label=method,
            linestyle="--" if dashed else "-",
        )
        for x, y, ell in zip(xs, ys, ells, strict=True):
            if ell is not None:
                ax.annotate(
                    f"L={ell}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 3),
                    fontsize=7,
                    color=line[0].get_color(),
                )
    return _finish(
        ax, "Single-draft frontier", x="AATPS (tokens per target forward)", y="ANLPPT-U (per-token evidence)"
    )


def _multidraft(ax: Any, rows: Sequence[EvalRow], info: RunInfo) -> bool:
    del info
    multi = [r for r in rows if r.method in ("mpfr", "gls")]
    if not multi:
        return False
    for method in ("mpfr", "gls"):
        for ell in sorted({r.lookahead for r in multi if r.method == method and r.lookahead is not None}):
            mine = [r for r in multi if (r.method, r.lookahead) == (method, ell)]
            bs = sorted({r.drafts for r in mine})
            stats = [group_stats([r for r in mine if r.drafts == b]) for b in bs]
            ax.errorbar(
                bs,
                [s.aatps[0] for s in stats],
                yerr=_nan0([s.aatps_se for s in stats]),
                marker="o",
                capsize=2,
                label=f"{method} L={ell}",
                linestyle="-" if method == "mpfr" else "--",
            )
    return _finish(ax, "Multi-draft: AATPS vs B (± 1 SE)", x="B (drafts per block)", y="AATPS")


def _tpr(ax: Any, rows: Sequence[EvalRow], info: RunInfo) -> bool:
    if not rows:
        return False
    tokens = [t for t in EVAL_TOKENS if t <= info.max_new_tokens] or [info.max_new_tokens]
    for group in headline_groups(rows):
        method = group[0].method
        keyed = bool(group[0].keyed)
        label = method + ("" if keyed else " (FPR)")
        ax.plot(
            tokens, [tpr(group, t) for t in tokens], marker="o", label=label, linestyle="-" if keyed else "--"
        )
        if method == "mse-pseudo":
            ax.plot(
                tokens,
                [tpr(group, t, k1_only=True) for t in tokens],
                marker="x",
                label="mse-pseudo [k1 only]",
                linestyle=":",
            )
    ax.axhline(ALPHA, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(-0.02, 1.02)
    title = "Detection vs text length (exact Gamma test)"
    return _finish(ax, title, x="evaluated tokens T", y=f"TPR at {ALPHA:.0%} FPR")


def _drafters(ax: Any, rows: Sequence[EvalRow], info: RunInfo) -> bool:
    del info
    groups = ablation_groups(rows)
    if not groups:
        return False
    names = sorted(groups, key=lambda k: (method_rank(k[0]), k[1:]))
    conditions = sorted({c for g in groups.values() for c in g})
    width = 0.8 / len(conditions)
    for j, cond in enumerate(conditions):
        xs, ys, es = [], [], []
        for i, name in enumerate(names):
            mine = groups[name].get(cond)
            if mine:
                s = group_stats(mine)
                xs.append(i + (j - (len(conditions) - 1) / 2) * width)
                ys.append(s.aatps[0])
                es.append(0.0 if math.isnan(s.aatps_se) else s.aatps_se)
        ax.bar(xs, ys, width=width, yerr=es, capsize=2, label=f"{cond[0]} T={cond[1]:g}")
    ax.figure.set_size_inches(min(14.0, max(7.2, 0.2 * len(names) * len(conditions))), 4.8)
    ax.set_xticks(range(len(names)))
    labels = [f"{m} L={ell}" + (f" B={b}" if b > 1 else "") for m, ell, b in names]
    ax.set_xticklabels(labels, fontsize=7, rotation=35, ha="right")
    return _finish(ax, "Drafter substitution: AATPS per drafter", x=None, y="AATPS", grid="y")


def _finish(ax: Any, title: str, *, x: str | None, y: str, grid: str = "both") -> bool:
    """Label the axes (x: None keeps the tick labels alone), title, legend and grid; True: drawn."""
    if x is not None:
        ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis=grid)
    return True


def _log_p_field(row: EvalRow) -> str:
    return "log_p_pseudo" if row.method == "mse-pseudo" else "log_p"


def _nan0(values: Sequence[float]) -> list[float]:
    return [0.0 if math.isnan(v) else v for v in values]
