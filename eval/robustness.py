"""Detection under attack: every generated text (and its first T tokens) edited by each attack
and detected as a user would detect it, from text, with the production detector.

`attack_rows` makes one `AttackRow` per (generation, attack, length): the answer's first T tokens
are decoded, attacked (`wmark.eval.attacks`, seeded by attack, row and seed) and detected with
`Detector` (canonical readings on) and, for comparison, a detector reading the text only as
submitted. Span attacks are decided by the window search (`Localizer`), the whole-document
p-value kept beside it. The paraphrase (a model attack) is made by a `Paraphraser` handed in by
the caller, for at most `paraphrase_limit` answers, and its ROUGE-L to the original goes in the row.
`render_attacks` tabulates TPR at alpha and the median log10 p per attack and length, the median
ROUGE-L of paraphrases, and TPR under three thresholds side by side: the analytic Gamma one, one
calibrated on the run's unattacked unwatermarked answers, and one from a negative corpus
(`wmark.eval.negatives`); `plot_attacks` draws TPR against tokens per attack.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wmark.detector import Detector
from wmark.detector.localize import Localizer
from wmark.errors import InputError, WmarkError
from wmark.eval.aggregate import empirical_threshold
from wmark.eval.attacks import ATTACKS, attack_rng, attacked
from wmark.eval.rows import EvalRow
from wmark.keymaterial import KeyMaterial

if TYPE_CHECKING:  # torch loads only when a paraphrase is asked for
    from wmark.eval.negatives import NegativeThresholds
    from wmark.eval.paraphrase import Paraphrase

Paraphrasing = Callable[[Sequence[int], np.random.Generator], "Paraphrase"]

__all__ = ["AttackRow", "attack_rows", "plot_attacks", "render_attacks"]

LN10 = math.log(10.0)


@dataclass(frozen=True, kw_only=True)
class AttackRow:
    """One attacked text and its detection (a line of attacks.jsonl).

    Attributes:
        row_id: the generation (results.jsonl row) the text came from.
        method, keyed: that generation's method and whether it carries the watermark.
        attack, level: the attack's name and level (none, char, word, span).
        tokens: the length T the answer was cut to before the attack (a shorter answer is
            used whole).
        text: the attacked text.
        n_tokens, n_scored: tokens and scored positions the detector read.
        log_p: ln of the decision p-value (span attacks: whole document and window search).
        whole_log_p: ln p of the whole-document test.
        raw_log_p: ln p of a detector that reads the text only as submitted.
        rouge_l: a paraphrase's ROUGE-L to the text it rewrote (None for other attacks).
    """

    row_id: str
    method: str
    keyed: bool
    attack: str
    level: str
    tokens: int
    text: str
    n_tokens: int
    n_scored: int
    log_p: float
    whole_log_p: float
    raw_log_p: float
    rouge_l: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The attacks.jsonl object."""
        return asdict(self)


def attack_rows(
    rows: Sequence[EvalRow],
    attacks: Sequence[str],
    *,
    key: KeyMaterial,
    tokenizer_json: bytes,
    decode: Callable[[Sequence[int]], str],
    lengths: Sequence[int],
    seed: int = 0,
    paraphrase: Paraphrasing | None = None,
    paraphrase_limit: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[AttackRow]:
    """Every row's answer, cut to each length, under each attack, detected.

    Args:
        rows: the generations (keyed ones give TPR, the others FPR).
        attacks: names in `wmark.eval.attacks.ATTACKS`.
        key: the evaluation key.
        tokenizer_json: its tokenizer.
        decode: token IDs -> text, the target's tokenizer.
        lengths: answer lengths T in tokens (an answer shorter than T is used whole).
        seed: the attack seed (each text draws from (attack, row, length, seed)).
        paraphrase: makes the "paraphrase" attack (required when it is among `attacks`).
        paraphrase_limit: paraphrase the answers of at most this many rows, watermarked rows
            first (each answer once per length); the others get no paraphrase row.
        progress: told "paraphrase i/n" before each paraphrase (they are slow).

    Raises:
        InputError: "paraphrase" is asked for without a `paraphrase` function.
    """
    model_attacks = [n for n in attacks if ATTACKS[n].level == "model"]
    if model_attacks and paraphrase is None:
        raise InputError(f"the {model_attacks[0]} attack needs the target model")
    tokenizers = {key.spec.tokenizer.sha256: tokenizer_json}
    detector = Detector([key], tokenizers)
    raw = Detector([key], tokenizers, normalize=False)
    localizer = Localizer(detector)
    ordered = sorted(rows, key=lambda r: not r.keyed)  # stable: watermarked rows first
    paraphrased = {r.row_id for r in ordered[:paraphrase_limit]} if model_attacks else set()
    todo, done = len(paraphrased) * len(set(lengths)), 0
    out = []
    for row in rows:
        for tokens in sorted(set(lengths)):
            ids = row.token_ids[:tokens]  # an answer shorter than T is used whole
            text = decode(ids)
            for name in attacks:
                doc = f"{row.row_id}/{tokens}"
                rouge = None
                if name in model_attacks:
                    if row.row_id not in paraphrased:
                        continue
                    assert paraphrase is not None
                    done += 1
                    if progress is not None:
                        progress(f"{name} {done}/{todo}")
                    made = paraphrase(ids, attack_rng(name, seed=seed, doc=doc))
                    edited, rouge = made.text, made.rouge_l
                else:
                    edited = attacked(name, text, seed=seed, doc=doc)
                found = _detect(row, name, tokens, edited, detector, raw, localizer)
                out.append(dataclasses.replace(found, rouge_l=rouge) if rouge is not None else found)
    return out


def _detect(
    row: EvalRow, name: str, tokens: int, text: str, detector: Detector, raw: Detector, localizer: Localizer
) -> AttackRow:
    try:
        found = detector.detect(text)
        whole, n_tokens, n_scored = found.log_p, found.n_tokens, found.n_scored
        decision = localizer.localize(text).log_p if ATTACKS[name].level == "span" else whole
        raw_log_p = raw.detect(text).log_p
    except WmarkError:  # nothing left to score (an attack emptied a short text)
        whole = decision = raw_log_p = 0.0
        n_tokens = n_scored = 0
    return AttackRow(
        row_id=row.row_id,
        method=row.method,
        keyed=row.keyed,
        attack=name,
        level=ATTACKS[name].level,
        tokens=tokens,
        text=text,
        n_tokens=n_tokens,
        n_scored=n_scored,
        log_p=decision,
        whole_log_p=whole,
        raw_log_p=raw_log_p,
    )


def _rate(log_ps: Sequence[float], alpha: float) -> tuple[float, float]:
    """Share of p-values <= alpha and its binomial standard error."""
    n = len(log_ps)
    k = sum(lp <= math.log(alpha) for lp in log_ps)
    rate = k / n
    return rate, math.sqrt(rate * (1 - rate) / n)


def render_attacks(
    rows: Sequence[AttackRow], *, alpha: float = 0.01, negatives: NegativeThresholds | None = None
) -> str:
    """Markdown: per attack and length, TPR at alpha (± binomial SE) and the median log10 p of
    the watermarked texts; the raw-text detector's TPR beside it; FPR on unwatermarked texts;
    the median ROUGE-L of paraphrases; then TPR under the analytic and the empirical thresholds."""
    lengths = sorted({r.tokens for r in rows})
    names = list(dict.fromkeys(r.attack for r in rows))
    head = " | ".join(f"TPR@{t}" for t in lengths)
    med = " | ".join(f"median log10 p @{t}" for t in lengths)
    lines = [
        f"# Detection under attack (alpha = {alpha:g}; TPR ± binomial SE)",
        "",
        f"| attack | level | n | {head} | {med} | raw-text detector TPR@{lengths[-1]} "
        "| FPR (unwatermarked) | median ROUGE-L |",
        "|---|---|---:|" + "---:|" * (2 * len(lengths) + 3),
    ]
    for name in names:
        keyed = [r for r in rows if r.attack == name and r.keyed]
        plain = [r for r in rows if r.attack == name and not r.keyed]
        tpr, medians = [], []
        for t in lengths:
            at = [r for r in keyed if r.tokens == t]
            if at:
                rate, se = _rate([r.log_p for r in at], alpha)
                tpr.append(f"{rate:.2f} ± {se:.2f}")
                medians.append(f"{float(np.median([r.log_p for r in at])) / LN10:.1f}")
            else:
                tpr.append("–")
                medians.append("–")
        longest = [r for r in keyed if r.tokens == lengths[-1]]
        raw = f"{_rate([r.raw_log_p for r in longest], alpha)[0]:.2f}" if longest else "–"
        fpr = f"{_rate([r.log_p for r in plain], alpha)[0]:.3f} (n {len(plain)})" if plain else "–"
        n = len({r.row_id for r in keyed})
        level = keyed[0].level if keyed else plain[0].level
        rouges = [r.rouge_l for r in rows if r.attack == name and r.rouge_l is not None]
        rouge = f"{float(np.median(rouges)):.2f} (n {len(rouges)})" if rouges else "–"
        cells = [name, level, str(n), *tpr, *medians, raw, fpr, rouge]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "TPR@T: the watermarked answers cut to their first T tokens (shorter answers whole), then",
        "attacked; span attacks are decided by the window search (whole document and windows,",
        "family-wise at alpha). The raw-text detector reads the text only as submitted. ROUGE-L:",
        "a paraphrase's LCS F-measure to the text it rewrote, over the target's token IDs.",
        "",
        *_threshold_table(rows, names, lengths, alpha, negatives),
    ]
    return "\n".join(lines) + "\n"


def _threshold_table(
    rows: Sequence[AttackRow],
    names: Sequence[str],
    lengths: Sequence[int],
    alpha: float,
    negatives: NegativeThresholds | None,
) -> list[str]:
    """TPR at alpha under the analytic threshold, one calibrated on the run's unattacked
    unwatermarked answers, and one from the negative corpus (when given), per length."""
    run: dict[int, tuple[float, int]] = {}
    for t in lengths:
        plain = [r.log_p for r in rows if r.attack == "none" and not r.keyed and r.tokens == t]
        run[t] = (empirical_threshold(plain, alpha), len(plain))
    corpus = {t: negatives.text_level.get(t, math.nan) if negatives else math.nan for t in lengths}
    counts = {t: negatives.counts.get(t, 0) if negatives else 0 for t in lengths}

    def log10(x: float) -> str:
        return "–" if math.isnan(x) else f"{x / LN10:.2f}"

    source = (
        f"corpus {negatives.source} ({negatives.documents} documents)" if negatives else "corpus: none given"
    )
    out = [
        f"## TPR at {alpha:g} under three thresholds: analytic / run's unwatermarked / {source}",
        "",
        "| attack | " + " | ".join(f"T={t}" for t in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
        "| threshold log10 p | "
        + " | ".join(f"{math.log10(alpha):.2f} / {log10(run[t][0])} / {log10(corpus[t])}" for t in lengths)
        + " |",
        "| negatives n | " + " | ".join(f"– / {run[t][1]} / {counts[t]}" for t in lengths) + " |",
    ]
    for name in names:
        cells = []
        for t in lengths:
            keyed = [r.log_p for r in rows if r.attack == name and r.keyed and r.tokens == t]
            if not keyed:
                cells.append("–")
                continue
            rates = [sum(lp <= math.log(alpha) for lp in keyed) / len(keyed)]
            rates += [
                math.nan if math.isnan(thr) else sum(lp < thr for lp in keyed) / len(keyed)
                for thr in (run[t][0], corpus[t])
            ]
            cells.append(" / ".join("–" if math.isnan(x) else f"{x:.2f}" for x in rates))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Analytic: p <= alpha under the exact Gamma test. Empirical: the (k+1)-th smallest ln p of n",
        "negatives, k = floor(alpha n), a text flagged when its ln p is strictly below it (at most k",
        "negatives are: the (1 - alpha) quantile of -ln p). Its resolution is 1/n: with fewer than",
        f"{math.ceil(1 / alpha)} negatives it is their smallest p-value (an empirical FPR of 0). The run's",
        "negatives are its unwatermarked answers, unattacked, cut to T; the corpus's are its documents",
        f"with at least T tokens, cut to T (no threshold below {math.ceil(1 / alpha)} of them). Both are",
        "detected as the attacked answers are. Span attacks are decided by the window search, whose null",
        "law is not the whole-text test's: their empirical columns are indicative only.",
    ]
    return out


def plot_attacks(rows: Sequence[AttackRow], out: Path, *, alpha: float = 0.01) -> Path | None:
    """attacks.png: TPR at alpha against answer tokens, one line per attack; None without rows."""
    from wmark.eval.plots import pyplot

    keyed = [r for r in rows if r.keyed]
    if not keyed:
        return None
    plt = pyplot()
    lengths = sorted({r.tokens for r in keyed})
    fig, ax = plt.subplots(figsize=(8.0, 5.0), dpi=110)
    for name in dict.fromkeys(r.attack for r in keyed):
        points = [
            (t, _rate([r.log_p for r in keyed if r.attack == name and r.tokens == t], alpha)[0])
            for t in lengths
            if any(r.attack == name and r.tokens == t for r in keyed)
        ]
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=name, linewidth=2.5 if name == "none" else 1.0)
    ax.set_xlabel("answer tokens before the attack")
    ax.set_ylabel(f"TPR at {alpha:g}")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    path = out / "attacks.png"
    fig.savefig(path)
    plt.close(fig)
    return path
