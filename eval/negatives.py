"""An empirical detection threshold from a given corpus of unwatermarked documents.

`wmark eval --negatives PATH`: every document is tokenised with the run's tokenizer, cut to its
first T tokens for each answer length T (documents shorter than T are left out at T), and
tested under the run's key, two ways:

- token level, as summary.md scores the answers (the Aaronson Gamma test on the pivots of the
  token IDs; a document has no prompt, so its first h tokens have no full window and are not
  scored);
- text level, as attacks.md detects the attacked answers (the production `Detector`, canonical
  readings on) on the decoded first T tokens.

The threshold at T is `wmark.eval.aggregate.empirical_threshold` of those ln p: with n documents
and k = floor(alpha * n), the (k+1)-th smallest ln p; a text is flagged when its ln p is strictly
below it, so at most k of the n negatives are (an empirical FPR <= alpha). In the "higher is more
watermarked" direction this is the (1 - alpha) empirical quantile of -ln p. Its resolution is
1/n: at alpha = 1 % fewer than 100 documents leave k = 0, a threshold at the smallest p-value
and a false-positive rate that cannot be told from 0. So the corpus must hold at least
`MIN_NEGATIVES` documents, and a length that fewer of them reach gets no threshold (NaN).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmark.detector import Detector, TextTokenizer, key_pivots
from wmark.errors import InputError, WmarkError
from wmark.eval.aggregate import ALPHA, empirical_threshold
from wmark.keymaterial import KeyMaterial
from wmark.prf import KeyedSource
from wmark.scoring import score_pivots

__all__ = ["MIN_NEGATIVES", "NegativeThresholds", "calibrate_negatives", "read_negatives"]

MIN_NEGATIVES = math.ceil(1 / ALPHA)  # 100: below it the 1 % quantile is the smallest p-value


@dataclass(frozen=True)
class NegativeThresholds:
    """Thresholds (ln p, flag when strictly below) calibrated on a negative corpus.

    Attributes:
        source: the corpus file, as given.
        documents: documents in it.
        counts: T -> documents at least T tokens long (those the threshold at T comes from).
        token_level: T -> threshold for the token-level test (summary.md); NaN when counts[T]
            < MIN_NEGATIVES.
        text_level: T -> threshold for the production detector on text (attacks.md); NaN likewise.
    """

    source: str
    documents: int
    counts: dict[int, int]
    token_level: dict[int, float]
    text_level: dict[int, float]


def read_negatives(path: Path) -> list[str]:
    """Documents of a negative corpus: a .jsonl file (one object with a "text" string, or one
    JSON string, per line) or any other text file (one document per non-empty line).

    Raises:
        InputError: unreadable file, a malformed line, or fewer than `MIN_NEGATIVES` documents.
    """
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--negatives {path}: cannot read ({exc})") from None
    docs = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            docs.append(line)
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"--negatives {path}, line {lineno}: not valid JSON ({exc.msg})") from None
        text = data.get("text") if isinstance(data, dict) else data
        if not isinstance(text, str):
            raise InputError(
                f'--negatives {path}, line {lineno}: expected {{"text": "..."}} or a JSON string'
            )
        docs.append(text)
    if len(docs) < MIN_NEGATIVES:
        raise InputError(
            f"--negatives {path}: {len(docs)} documents; an empirical {ALPHA:.0%} threshold needs at least "
            f"{MIN_NEGATIVES} (with n documents the false-positive rate moves in steps of 1/n)"
        )
    return docs


def calibrate_negatives(
    docs: Sequence[str],
    *,
    key: KeyMaterial,
    tokenizer_json: bytes,
    lengths: Sequence[int],
    source: str,
    alpha: float = ALPHA,
) -> NegativeThresholds:
    """The token-level and text-level thresholds at each length in `lengths` (see the module doc)."""
    tokenizer = TextTokenizer(tokenizer_json, key.spec.tokenizer.name)
    if tokenizer.sha256 != key.spec.tokenizer.sha256:
        raise InputError("--negatives: the tokenizer is not the run key's")
    keyed = KeyedSource(key.secret, key.spec)
    detector = Detector([key], {tokenizer.sha256: tokenizer_json})
    encoded = tokenizer.encode_batch(list(docs))
    counts, token_level, text_level = {}, {}, {}
    for t in sorted(set(lengths)):
        long_enough = [ids[:t] for ids in encoded if len(ids) >= t]
        counts[t] = len(long_enough)
        if len(long_enough) < MIN_NEGATIVES:
            token_level[t] = text_level[t] = math.nan
            continue
        token_level[t] = empirical_threshold(
            [score_pivots(key_pivots(ids, keyed).pivots).log_p for ids in long_enough], alpha
        )
        text_level[t] = empirical_threshold(
            [_text_log_p(detector, tokenizer, ids) for ids in long_enough], alpha
        )
    return NegativeThresholds(source, len(docs), counts, token_level, text_level)


def _text_log_p(detector: Detector, tokenizer: TextTokenizer, ids: np.ndarray) -> float:
    try:
        return detector.detect(tokenizer.decode(ids.tolist())).log_p
    except WmarkError:  # nothing to score: as far from a detection as a text gets
        return 0.0
