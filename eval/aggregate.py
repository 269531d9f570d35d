"""From rows to figures: per-setting statistics, TPR curves, H0 calibration, drafter ablation.

Rows are the `EvalRow`s of results.jsonl (`wmark.eval.runner.run_job`). A *setting* is
(method, L, B, drafter, draft temperature); the *default condition* is the run's first drafter
and temperature, which the main tables use. Every figure is a mean ± std over texts
(prompts x seeds) unless stated otherwise.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from wmark.eval.detection import (
    DEFAULT_TAU,
    TauFit,
    TextPivots,
    cross_validate_tau,
    generated_pivots,
    mixed_pivots,
)
from wmark.eval.metrics import (
    Interval,
    binomial_interval,
    log_p_at,
    mean_std,
    rouge_l,
    standard_error,
)
from wmark.eval.rows import EvalRow
from wmark.eval.runner import RunInfo
from wmark.generator.engine import METHODS
from wmark.prf import KeyedSource
from wmark.scoring import SCORES, ScoreName, score_pivots
from wmark.secret import Secret
from wmark.spec import WatermarkSpec

__all__ = [
    "ALPHA",
    "EVAL_TOKENS",
    "GroupStats",
    "METHOD_ORDER",
    "SettingKey",
    "ablation_groups",
    "calibration_other_keys",
    "empirical_threshold",
    "group_rows",
    "group_stats",
    "is_default",
    "row_log_p",
    "tau_fits",
    "text_drift",
    "tpr",
]

SettingKey = tuple[str, int | None, int, str | None, float | None]
ALPHA = 0.01
EVAL_TOKENS = (8, 16, 24, 32, 48, 64, 96, 128)
METHOD_ORDER = ("basic-uwm", "vsps", "pfr-nowm", "mws", "mse", "mse-pseudo", "pfr", "mpfr", "gls")
PSEUDO_K1 = "mse-pseudo [k1 only]"  # mse-pseudo scored with the watermark key alone


def setting_of(row: EvalRow) -> SettingKey:
    """(method, L, B, drafter, draft temperature) of a row."""
    return (row.method, row.lookahead, row.drafts, row.drafter, row.draft_temperature)


def is_default(row: EvalRow, info: RunInfo) -> bool:
    """Whether the row ran under the default drafter condition (basic-uwm always does)."""
    return row.drafter is None or (
        row.drafter == info.default_drafter and row.draft_temperature == info.default_draft_temperature
    )


def group_rows(rows: Iterable[EvalRow]) -> dict[SettingKey, list[EvalRow]]:
    """Rows by setting, each group sorted by (prompt, seed)."""
    groups: dict[SettingKey, list[EvalRow]] = defaultdict(list)
    for row in rows:
        groups[setting_of(row)].append(row)
    return {k: sorted(v, key=lambda r: (r.prompt_key, r.seed)) for k, v in groups.items()}


def method_rank(method: str) -> int:
    """Sort position of a method in tables."""
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def pseudo_pivots(row: EvalRow, tau: float = DEFAULT_TAU) -> list[float]:
    """mse-pseudo's mixed pivots of a row."""
    pivots: list[float] = mixed_pivots(row.pivots, row.pivots_k2, row.r_k2, tau).tolist()
    return pivots


def detector_pivots(row: EvalRow, *, k1_only: bool = False) -> list[float]:
    """The pivots of the detector docs/algorithms.md §7 names for the row's method."""
    if row.method == "mse-pseudo" and not k1_only:
        return pseudo_pivots(row)
    return list(row.pivots)


def _anlppt(row: EvalRow, score: ScoreName, pseudo: bool) -> float:
    log_p = (row.log_p_pseudo if pseudo else row.log_p)[score]
    return -log_p / row.n_scored if row.n_scored else math.nan


def tpr(rows: Sequence[EvalRow], tokens: int, *, k1_only: bool = False, alpha: float = ALPHA) -> float:
    """Fraction of rows detected at `tokens` generated tokens (the empirical FPR for unwatermarked ones)."""
    hits = [
        log_p_at(r.scored_positions, detector_pivots(r, k1_only=k1_only), tokens)[0] <= math.log(alpha)
        for r in rows
    ]
    return sum(hits) / len(hits) if hits else math.nan


def row_log_p(row: EvalRow, tokens: int) -> float:
    """ln p of a row's first `tokens` generated tokens under the watermark key's pivots."""
    return log_p_at(row.scored_positions, detector_pivots(row, k1_only=False), tokens)[0]


def empirical_threshold(negative_log_ps: Sequence[float], alpha: float = ALPHA) -> float:
    """The ln p threshold calibrated on unwatermarked texts, as the paper's figures calibrate it.

    A text is detected when its ln p is *below* the threshold; the threshold is the (k+1)-th
    smallest negative ln p with k = floor(alpha * n), so at most k of the n negatives (an
    empirical FPR <= alpha) fall below it. NaN without negatives.
    """
    ordered = sorted(negative_log_ps)
    if not ordered:
        return math.nan
    return ordered[int(math.floor(alpha * len(ordered)))]


@dataclass(frozen=True)
class GroupStats:
    """The figures of one setting (or of mse-pseudo under the k1-only detector).

    Attributes:
        label: method name as shown in tables.
        n: number of texts.
        aatps / tokens_per_s / lppl / rouge_l: (mean, std) over texts.
        aatps_se: standard error of the mean AATPS.
        anlppt: (mean, std) per score.
        tpr: detection rate at each of `EVAL_TOKENS` (empirical FPR for unwatermarked methods).
        pooled_aatps / pooled_anlppt_u: Hu & Huang's pooled conventions.
        keyed: whether the method carries the watermark.
    """

    label: str
    n: int
    aatps: tuple[float, float]
    aatps_se: float
    tokens_per_s: tuple[float, float]
    anlppt: dict[ScoreName, tuple[float, float]]
    tpr: dict[int, float]
    lppl: tuple[float, float]
    rouge_l: tuple[float, float]
    pooled_aatps: float
    pooled_anlppt_u: float
    keyed: bool


def group_stats(rows: Sequence[EvalRow], *, k1_only: bool = False) -> GroupStats:
    """Statistics of one setting's rows; `k1_only` scores mse-pseudo with the watermark key alone."""
    method = rows[0].method
    pseudo = method == "mse-pseudo" and not k1_only
    blocks = [b for r in rows for b in r.blocks]
    log_p_u = [(r.log_p_pseudo if pseudo else r.log_p)["u"] for r in rows]
    return GroupStats(
        label=PSEUDO_K1 if method == "mse-pseudo" and k1_only else method,
        n=len(rows),
        aatps=mean_std([r.aatps for r in rows]),
        aatps_se=standard_error([r.aatps for r in rows]),
        tokens_per_s=mean_std([r.tokens_per_s for r in rows]),
        anlppt={s: mean_std([_anlppt(r, s, pseudo) for r in rows]) for s in SCORES},
        tpr={t: tpr(rows, t, k1_only=k1_only) for t in EVAL_TOKENS},
        lppl=mean_std([r.lppl for r in rows]),
        rouge_l=mean_std([r.rouge_l for r in rows if r.rouge_l is not None]),
        pooled_aatps=sum(blocks) / len(blocks) if blocks else math.nan,
        pooled_anlppt_u=-sum(log_p_u) / max(1, sum(r.n_tokens for r in rows)),
        keyed=METHODS[method].keyed if method in METHODS else bool(rows[0].keyed),
    )


def text_pivots_of(row: EvalRow) -> TextPivots:
    """The stored pivots of a row."""
    return TextPivots(
        positions=np.asarray(row.scored_positions, dtype=np.int64),
        u1=np.asarray(row.pivots, dtype=np.float64),
        u2=np.asarray(row.pivots_k2, dtype=np.float64),
        r=np.asarray(row.r_k2, dtype=np.float64),
    )


def tau_fits(rows: Sequence[EvalRow], tokens: Sequence[int], *, splits: int = 10) -> dict[int, TauFit]:
    """mse-pseudo's tau fitted on random halves of its texts, held-out TPR, at each T."""
    texts = [text_pivots_of(r) for r in rows]
    return {t: cross_validate_tau(texts, t, ALPHA, splits=splits) for t in tokens} if len(texts) >= 2 else {}


def unique_texts(rows: Iterable[EvalRow]) -> list[EvalRow]:
    """One row per distinct (prompt, tokens): equal texts from several methods count once."""
    seen: dict[tuple[str, tuple[int, ...]], EvalRow] = {}
    for r in rows:
        seen.setdefault((r.prompt_key, tuple(r.token_ids)), r)
    return list(seen.values())


def calibration_other_keys(rows: Sequence[EvalRow], spec: WatermarkSpec, *, keys: int = 100) -> Interval:
    """Rate of p <= ALPHA over every distinct text, each under `keys` fresh random keys.

    A text is independent of a key drawn after it, so each (text, key) p-value is an H0 draw on
    real text (repetitions, templates and all). Every pair gets its own key: texts that share
    windows (same prompt, common openings) would otherwise give correlated p-values under a
    shared key, and the binomial interval would be too narrow.
    """
    hits = total = 0
    for i, r in enumerate(unique_texts(rows)):
        for k in range(keys):
            secret = Secret(hashlib.sha256(b"wmark.eval.h0-key.%d.%d" % (i, k)).digest())
            u = generated_pivots(r.prompt_tail, r.token_ids, KeyedSource(secret, spec)).pivots
            total += 1
            hits += score_pivots(u).log_p <= math.log(ALPHA)
    return binomial_interval(hits, total)


def ablation_groups(
    rows: Iterable[EvalRow],
) -> dict[tuple[str, int | None, int], dict[tuple[str, float], list[EvalRow]]]:
    """Speculative rows by (method, L, B), then by drafter condition (drafter, temperature).

    Each group keeps only the (prompt, seed) pairs that every one of its conditions ran, so that
    AATPS, TPR and text drift compare drafters on the same texts (a default-drafter run over
    more prompts than the ablation would otherwise show a "drift" that is only prompt choice).
    """
    out: dict[tuple[str, int | None, int], dict[tuple[str, float], list[EvalRow]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rows:
        if r.drafter is not None and r.draft_temperature is not None:  # basic-uwm drafts nothing
            out[(r.method, r.lookahead, r.drafts)][(r.drafter, r.draft_temperature)].append(r)
    groups = {}
    for setting, conditions in out.items():
        if len(conditions) < 2:
            continue
        common = set.intersection(*({(r.prompt_key, r.seed) for r in v} for v in conditions.values()))
        groups[setting] = {
            cond: [r for r in v if (r.prompt_key, r.seed) in common] for cond, v in conditions.items()
        }
    return groups


def text_drift(default: Sequence[EvalRow], other: Sequence[EvalRow]) -> tuple[int, int, float]:
    """(texts that differ, texts compared, mean ROUGE-L vs the default condition's text).

    Texts are matched by prompt and seed.
    """
    base = {(r.prompt_key, r.seed): r.token_ids for r in default}
    pairs = [(base[(r.prompt_key, r.seed)], r.token_ids) for r in other if (r.prompt_key, r.seed) in base]
    differ = sum(a != b for a, b in pairs)
    rouge = float(np.mean([rouge_l(b, a) for a, b in pairs])) if pairs else math.nan
    return differ, len(pairs), rouge
