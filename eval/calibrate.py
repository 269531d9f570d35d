"""`wmark calibrate`: a key's false-positive rate measured on the user's own unwatermarked text.

A key's p-values are exact in theory; calibration checks that on the text the key will be used
on. Each document is detected as `wmark detect` detects it, under each key alone (so the rate
is the key's own, not a family-wise one), and the report gives, per key: the share of documents
with p <= alpha with its Clopper-Pearson interval and the interval Binomial(n, alpha) allows,
the same per length bucket (scored tokens), a one-sided KS test of the p-values against the
uniform, and the smallest p-value seen (`wmark.eval.calibration_stats` says why one-sided).

A corpus can make the detector misbehave, or make its rate look wrong; each such document is
counted in the report and named in its warnings, never dropped silently:

- unreadable (the source could not read it, or not valid Unicode), blank, or over `max_chars`;
- exact duplicates of an earlier document: identical texts have identical p-values, so a
  duplicate would count one outcome twice; scored once;
- near-duplicates: more than half of their 8-word shingles (the rule of `wmark.eval.corpus`,
  estimated from the quarter of shingles whose hash starts below 64, ~20 bytes of memory a word)
  occurred in earlier documents. Scored, but kept out of the rate: copies are not independent of
  what they copy, and the binomial interval assumes independent documents; how many of them
  were flagged is reported apart;
- too short for the key: fewer scored tokens than its `min_scored_tokens` (one-token texts,
  repeated boilerplate, whose repeated windows are not scored). Detection answers
  "insufficient_evidence" for them, never a false positive; counted per key.

The corpus is identified by `corpus_sha256`: the SHA-256 of the sorted SHA-256s of all its texts
(every document read as text, scored or not), so the same texts in another order or from another
path give the same digest, whatever the settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from wmark import __version__
from wmark.detector import Detector
from wmark.detector.checks import check_text
from wmark.errors import InputError, InsufficientTextError
from wmark.eval.calibration_stats import LengthBucket, Rate, Uniformity, buckets, rate, uniformity
from wmark.eval.corpus import MAX_SHARED, shingles
from wmark.keymaterial import KeyMaterial

__all__ = [
    "MAX_CHARS",
    "CalibrationReport",
    "CalibrationRun",
    "CorpusCounts",
    "CorpusText",
    "calibrate",
]

MAX_CHARS = 4 << 20  # as `wmark detect --max-bytes`: detection holds ~130 bytes per byte of text
_BATCH = 64  # documents tokenised together
_SAMPLED = 64  # a shingle is compared when its hash's first byte is below this (a quarter)


@dataclass(frozen=True)
class CorpusText:
    """One document of the corpus: its label and text (None when it could not be read)."""

    source: str
    text: str | None
    error: str | None = None


@dataclass
class CorpusCounts:
    """What happened to the corpus's documents (the same for every key).

    Attributes:
        read: documents given.
        unreadable, empty, too_long: left out (see the module doc).
        duplicates: exact copies of an earlier document, left out.
        near_duplicates: scored, but kept out of the rate.
        distinct: documents scored into the rate (before the per-key too-short count).
    """

    read: int = 0
    unreadable: int = 0
    empty: int = 0
    too_long: int = 0
    duplicates: int = 0
    near_duplicates: int = 0
    distinct: int = 0


@dataclass(frozen=True, kw_only=True)
class CalibrationReport:
    """One key's calibration (stored with the key by `wmark calibrate`).

    Attributes:
        key_id: the key.
        alpha, confidence: the level measured at, and the intervals' confidence.
        corpus_sha256: identifies the corpus (see the module doc).
        corpus: what happened to its documents.
        too_short: distinct documents with fewer scored tokens than the key's minimum.
        fpr: the rate over the scored distinct documents.
        length_buckets: the rate per range of scored tokens.
        near_duplicates: the rate over the near-duplicates (not part of `fpr`).
        uniformity: the one-sided KS test of the scored documents' p-values.
        min_log_p, min_p_source: the smallest p-value among all scored documents, and where.
        warnings: what the user should know about this corpus and key, one sentence each.
    """

    key_id: str
    alpha: float
    confidence: float
    corpus_sha256: str
    corpus: CorpusCounts
    too_short: int
    fpr: Rate
    length_buckets: tuple[LengthBucket, ...]
    near_duplicates: Rate
    uniformity: Uniformity
    min_log_p: float
    min_p_source: str | None
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what the registry stores)."""
        return {
            "key_id": self.key_id,
            "alpha": self.alpha,
            "confidence": self.confidence,
            "corpus_sha256": self.corpus_sha256,
            "documents": {**vars(self.corpus), "too_short": self.too_short, "scored": self.fpr.scored},
            "fpr": self.fpr.to_dict(),
            "length_buckets": [b.to_dict() for b in self.length_buckets],
            "near_duplicates": self.near_duplicates.to_dict(),
            "uniformity": self.uniformity.to_dict(),
            "min_p": {
                "p_value": math.exp(self.min_log_p),
                "log_p": self.min_log_p,
                "source": self.min_p_source,
            },
            "warnings": list(self.warnings),
            "wmark_version": __version__,
        }


@dataclass(frozen=True)
class CalibrationRun:
    """Every key's report, and each key's p-values of the scored distinct documents (for QQ plots)."""

    reports: tuple[CalibrationReport, ...]
    p_values: Mapping[str, np.ndarray]


Screened = Literal["new", "duplicate", "near_duplicate"]


class _Screen:
    """Exact and near copies among the documents seen so far, and the corpus digest."""

    def __init__(self, max_shared: float) -> None:
        self.max_shared = max_shared
        self.digests: list[bytes] = []
        self._texts: set[bytes] = set()
        self._shingles: set[bytes] = set()

    def record(self, text: str) -> bytes:
        """Count the text into the corpus digest; its own SHA-256."""
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        self.digests.append(digest)
        return digest

    def screen(self, text: str, digest: bytes) -> Screened:
        if digest in self._texts:
            return "duplicate"
        self._texts.add(digest)
        sampled = {s for s in shingles(text) if s[0] < _SAMPLED}
        if not sampled:  # too few words to sample: only exact copies are caught
            return "new"
        novel = len(sampled - self._shingles) / len(sampled)
        self._shingles |= sampled
        return "near_duplicate" if novel < 1.0 - self.max_shared else "new"

    def corpus_sha256(self) -> str:
        return hashlib.sha256(b"".join(sorted(self.digests))).hexdigest()


@dataclass
class _KeyTally:
    log_p: list[float] = field(default_factory=list)
    n_scored: list[int] = field(default_factory=list)
    near_log_p: list[float] = field(default_factory=list)
    too_short: int = 0
    min_log_p: float = 0.0
    min_source: str | None = None


def calibrate(
    texts: Iterable[CorpusText],
    keys: Sequence[KeyMaterial],
    tokenizers: Mapping[str, bytes] | Callable[[str], bytes],
    *,
    alpha: float = 0.01,
    confidence: float = 0.99,
    max_chars: int = MAX_CHARS,
    max_shared: float = MAX_SHARED,
    on_batch: Callable[[int], None] | None = None,
) -> CalibrationRun:
    """Calibrate each key on the corpus `texts` (see the module doc).

    Args:
        texts: the corpus, read once, in batches.
        keys: the keys (each is tested alone).
        tokenizers: the keys' tokenizer.json bytes by SHA-256, or a lookup.
        alpha: the significance level whose false-positive rate is measured.
        confidence: of the intervals.
        max_chars: longer documents are counted and left out.
        max_shared: near-duplicate threshold (share of shingles seen before).
        on_batch: called with the number of documents read so far, after each batch is scored.
    """
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be between 0 and 1, got {alpha}")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be between 0 and 1, got {confidence}")
    detector = Detector(keys, tokenizers)
    counts = CorpusCounts()
    screen = _Screen(max_shared)
    tallies = {k.key_id: _KeyTally() for k in keys}
    stream = iter(texts)
    while batch := list(itertools.islice(stream, _BATCH)):
        kept: list[tuple[str, str, bool]] = []
        for doc in batch:
            near = _admit(doc, counts, screen, max_chars)
            if near is not None:
                kept.append((doc.source, doc.text or "", near))
        for (source, _, near), encodings in zip(
            kept, detector.encode_many([t for _, t, _ in kept]), strict=True
        ):
            for scored in detector.score_keys(encodings):
                _tally(
                    tallies[scored.key.key_id], scored.test.log_p, scored.test.n, scored.enough, near, source
                )
        if on_batch is not None:
            on_batch(counts.read)
    digest = screen.corpus_sha256()
    reports = tuple(_report(k, tallies[k.key_id], counts, digest, alpha, confidence) for k in keys)
    p_values = {k.key_id: np.exp(np.asarray(tallies[k.key_id].log_p, dtype=np.float64)) for k in keys}
    return CalibrationRun(reports, p_values)


def _admit(doc: CorpusText, counts: CorpusCounts, screen: _Screen, max_chars: int) -> bool | None:
    """Count the document; None when it is left out, else whether it is a near-duplicate."""
    counts.read += 1
    if doc.text is None:
        counts.unreadable += 1
        return None
    digest = screen.record(doc.text)
    try:
        check_text(doc.text)
    except InsufficientTextError:
        counts.empty += 1
        return None
    except InputError:  # not valid Unicode (a lone surrogate)
        counts.unreadable += 1
        return None
    if len(doc.text) > max_chars:
        counts.too_long += 1
        return None
    found = screen.screen(doc.text, digest)
    if found == "duplicate":
        counts.duplicates += 1
        return None
    if found == "near_duplicate":
        counts.near_duplicates += 1
        return True
    counts.distinct += 1
    return False


def _tally(tally: _KeyTally, log_p: float, n: int, enough: bool, near: bool, source: str) -> None:
    if not enough:
        if not near:
            tally.too_short += 1
        return
    if near:
        tally.near_log_p.append(log_p)
    else:
        tally.log_p.append(log_p)
        tally.n_scored.append(n)
    if log_p < tally.min_log_p or tally.min_source is None:
        tally.min_log_p, tally.min_source = log_p, source


def _report(
    key: KeyMaterial, tally: _KeyTally, counts: CorpusCounts, digest: str, alpha: float, confidence: float
) -> CalibrationReport:
    log_alpha = math.log(alpha)
    log_p = np.asarray(tally.log_p, dtype=np.float64)
    flagged = log_p <= log_alpha
    near_flagged = int(np.sum(np.asarray(tally.near_log_p) <= log_alpha))
    report = CalibrationReport(
        key_id=key.key_id,
        alpha=alpha,
        confidence=confidence,
        corpus_sha256=digest,
        corpus=CorpusCounts(**vars(counts)),
        too_short=tally.too_short,
        fpr=rate(int(flagged.sum()), len(log_p), alpha=alpha, confidence=confidence),
        length_buckets=tuple(
            buckets(
                np.asarray(tally.n_scored, dtype=np.int64),
                flagged,
                min_scored_tokens=key.spec.min_scored_tokens,
                alpha=alpha,
                confidence=confidence,
            )
        ),
        near_duplicates=rate(near_flagged, len(tally.near_log_p), alpha=alpha, confidence=confidence),
        uniformity=uniformity(np.exp(log_p)),
        min_log_p=tally.min_log_p,
        min_p_source=tally.min_source,
    )
    return _with_warnings(report, key)


def _with_warnings(r: CalibrationReport, key: KeyMaterial) -> CalibrationReport:
    """The report with a sentence for each thing about the corpus that the rate alone hides."""
    out: list[str] = []
    c, n, level = r.corpus, r.fpr.scored, f"{r.confidence:.0%}"
    if c.unreadable or c.empty or c.too_long:
        out.append(
            f"{c.unreadable} unreadable, {c.empty} blank and {c.too_long} over-long documents of "
            f"{c.read} were left out"
        )
    if c.duplicates:
        out.append(
            f"{c.duplicates} documents are exact copies of earlier ones: scored once (a copy has "
            "the same p-value, and counted again it would move the rate)"
        )
    if c.near_duplicates:
        out.append(
            f"{c.near_duplicates} near-duplicates (more than half their 8-word shingles seen in "
            f"earlier documents) are kept out of the rate, as copies are not independent: "
            f"{r.near_duplicates.flagged} of them are at p <= {r.alpha}"
        )
    if r.too_short:
        out.append(
            f"{r.too_short} of {c.distinct} documents ({r.too_short / c.distinct:.0%}) have fewer than "
            f"{key.spec.min_scored_tokens} scored tokens and cannot be scored: too short, or repeated "
            "text whose repeated contexts are not scored; detection answers insufficient_evidence for them"
        )
    if n == 0:
        out.append("no document could be scored: there is no false-positive rate to report")
    elif n < 10 / r.alpha:
        out.append(
            f"only {n} documents were scored: at alpha {r.alpha} that is few false positives to count, "
            f"and a wide interval; calibrate on at least {math.ceil(10 / r.alpha)}"
        )
    if n and not r.fpr.within:
        out.append(
            f"the false-positive rate {r.fpr.rate:.4f} is above alpha {r.alpha}: {r.fpr.flagged} of {n} "
            f"documents flagged, more than the {level} binomial interval "
            f"[{r.fpr.expected_low}, {r.fpr.expected_high}] allows; look for text written with this key, "
            "machine-generated text, or copies the near-duplicate rule missed"
        )
    if n and r.uniformity.p_value < 1.0 - r.confidence:
        out.append(
            f"the p-values are smaller than uniform ones (one-sided KS p = {r.uniformity.p_value:.2g}): "
            "see the QQ plot (--qq)"
        )
    if n and r.min_log_p < math.log(r.alpha / n):
        out.append(
            f"{r.min_p_source} has p = {math.exp(r.min_log_p):.2g}, below alpha / n = {r.alpha / n:.2g}: "
            "an unwatermarked text reaches that rarely; check whether it was written with this key"
        )
    return dataclasses.replace(r, warnings=tuple(out))
