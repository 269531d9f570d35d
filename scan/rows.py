"""What a scan writes: one flat row per document (the same columns in JSONL, CSV and Parquet),
running counts, and the summary at the end."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from wmark.detector.localize import Localization

__all__ = ["COLUMNS", "RECEIPT_COLUMNS", "ScanRow", "ScanSummary", "Tally"]


@dataclass(frozen=True, kw_only=True)
class ScanRow:
    """The result for one document.

    Attributes:
        source: file URL (absolute path for local files) or SQL URL (password hidden).
        doc_id: place in the source: "" (whole file), "line:N", "row:N", or the SQL id.
        verdict: "watermarked", "not_detected", "insufficient_evidence" or "error".
        p_value, log_p: the decision p-value (family-wise over keys, the whole document and
            its windows) and its natural log.
        key_id: the matched key, else the key with the smallest p-value.
        n_tokens, n_scored: tokens and scored positions of the document under that key.
        whole_p_value: the whole-document test alone, as `wmark detect` reports it.
        window_start, window_end: the best window's tokens [start, end).
        window_start_char, window_end_char: its characters, for watermarked documents.
        window_n_scored: scored positions in the best window.
        window_p_value: its p-value corrected for the number of windows; window_p_raw: alone.
        n_windows: windows tested under that key.
        error: why the document could not be scanned (verdict "error").
        receipt: the signed receipt of the verdict (`wmark scan --receipts`; None for error
            rows): a column only of scans with receipts (`RECEIPT_COLUMNS`).
    """

    source: str
    doc_id: str
    verdict: str
    p_value: float | None = None
    log_p: float | None = None
    key_id: str | None = None
    n_tokens: int | None = None
    n_scored: int | None = None
    whole_p_value: float | None = None
    window_start: int | None = None
    window_end: int | None = None
    window_start_char: int | None = None
    window_end_char: int | None = None
    window_n_scored: int | None = None
    window_p_value: float | None = None
    window_p_raw: float | None = None
    n_windows: int | None = None
    error: str | None = None
    receipt: str | None = None

    @classmethod
    def detected(cls, source: str, doc_id: str, found: Localization) -> ScanRow:
        """The row of a scanned document."""
        w = found.window
        return cls(
            source=source,
            doc_id=doc_id,
            verdict=found.verdict,
            p_value=found.p_value,
            log_p=found.log_p,
            key_id=found.key_id,
            n_tokens=found.n_tokens,
            n_scored=found.n_scored,
            whole_p_value=found.whole_p_value,
            window_start=None if w is None else w.start,
            window_end=None if w is None else w.end,
            window_start_char=None if w is None else w.start_char,
            window_end_char=None if w is None else w.end_char,
            window_n_scored=None if w is None else w.n_scored,
            window_p_value=None if w is None else math.exp(w.log_p),
            window_p_raw=None if w is None else math.exp(w.log_p_raw),
            n_windows=None if w is None else w.n_windows,
        )

    @classmethod
    def failed(cls, source: str, doc_id: str, message: str) -> ScanRow:
        """The row of a document that could not be scanned."""
        return cls(source=source, doc_id=doc_id, verdict="error", error=message)

    def to_dict(self, columns: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The row as a flat dict, in the order of `columns` (default `COLUMNS`)."""
        # flat: no deep copy as in asdict
        return {name: getattr(self, name) for name in (COLUMNS if columns is None else columns)}


# The columns of every scan; a scan with receipts adds "receipt" (so an output written before
# receipts existed keeps its columns when it is resumed).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ScanRow) if f.name != "receipt")
RECEIPT_COLUMNS: tuple[str, ...] = (*COLUMNS, "receipt")


@dataclass
class Tally:
    """Running counts over rows: documents per verdict, watermarked documents per key, tokens."""

    by_verdict: Counter[str] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    documents: int = 0
    tokens: int = 0

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Count rows (ScanRow dicts, or rows read back from an output file)."""
        for row in rows:
            self.documents += 1
            self.by_verdict[str(row["verdict"])] += 1
            if row["verdict"] == "watermarked" and row.get("key_id"):
                self.by_key[str(row["key_id"])] += 1
            if row.get("n_tokens") not in (None, ""):
                self.tokens += int(row["n_tokens"])


@dataclass(frozen=True, kw_only=True)
class ScanSummary:
    """The end of a scan.

    Attributes:
        output: the output file.
        documents: rows in the output (every document, resumed runs included).
        by_verdict: documents per verdict.
        by_key: watermarked documents per key.
        tokens: tokens scanned, over all rows.
        resumed: rows already in the output when this run started.
        run_documents, run_tokens: what this run scanned.
        elapsed_s: this run's wall time.
        docs_per_s, tokens_per_s: this run's throughput.
        skipped_files: files of unknown format left out of a directory walk or glob.
    """

    output: str
    documents: int
    by_verdict: dict[str, int]
    by_key: dict[str, int]
    tokens: int
    resumed: int
    run_documents: int
    run_tokens: int
    elapsed_s: float
    docs_per_s: float
    tokens_per_s: float
    skipped_files: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)
