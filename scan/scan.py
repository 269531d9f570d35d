"""Batch scans of document stores: read, detect in batches on workers, write rows in order.

`prepare_scan` wires a source (fsspec URLs or a SQL query), a crash-safe `Journal` and an
executor (in-process, local processes or Dask) into a `ScanJob`; `run_scan`
(`wmark.scan.loop`) is its loop, and `scan` does both. The driver reads the
documents and writes the output; workers only detect, so they need neither storage nor
database credentials. Rows are committed in the sources' order, so an interrupted scan
resumed with `--resume` writes the same output as one that was never interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wmark.detector.localize import DEFAULT_MIN_WINDOW
from wmark.errors import InputError, TokenizerError
from wmark.keymaterial import KeyMaterial
from wmark.scan.batches import BATCH_DOCS
from wmark.scan.journal import Journal, output_format
from wmark.scan.limits import ReadLimits
from wmark.scan.loop import ScanProgress, run_scan
from wmark.scan.receipts import ScanReceipts
from wmark.scan.rows import RECEIPT_COLUMNS, ScanSummary
from wmark.scan.sources import FileSource, SourceOptions
from wmark.scan.sql_source import SqlSource
from wmark.scan.workers import (
    DaskExecutor,
    Executor,
    InlineExecutor,
    PoolExecutor,
    WorkerConfig,
)

# ScanProgress is the loop's (`wmark.scan.loop`); named here too for `on_progress` callers.
__all__ = ["ScanJob", "ScanProgress", "prepare_scan", "scan"]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the CPUs this process may use (containers)
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _normalise(url: str) -> str:
    return url if "://" in url or "::" in url else os.path.abspath(os.path.expanduser(url))


class ScanJob:
    """A scan ready to run: sources listed, output opened (or reopened), workers started.

    Build it with `prepare_scan` (every input error surfaces there, before any work), then
    `run` it; `close` (or a `with` block) releases the workers, the output and the database.

    Attributes:
        complete: the output already holds a finished scan (`summary` says what it found).
        summary: the stored summary of a finished scan, else None.
        receipts: its rows carry signed receipts (`run` must be given a `ScanReceipts`).
        resumed: rows the output held before this run.
    """

    def __init__(
        self,
        source: FileSource | SqlSource,
        journal: Journal,
        executor: Executor | None,
        batch_docs: int,
        limits: ReadLimits,
    ) -> None:
        self._source = source
        self._limits = limits
        self._journal = journal
        self._executor = executor
        self._batch_docs = batch_docs
        self.complete = journal.complete
        self.receipts = journal.columns == RECEIPT_COLUMNS
        self.resumed = journal.resumed
        self.summary: ScanSummary | None = None
        if journal.complete and journal.summary:  # nothing left for this run to do
            stored = journal.summary
            idle = {
                "run_documents": 0,
                "run_tokens": 0,
                "elapsed_s": 0.0,
                "docs_per_s": 0.0,
                "tokens_per_s": 0.0,
            }
            self.summary = ScanSummary(**{**stored, **idle, "resumed": stored["documents"]})

    def run(
        self,
        on_progress: Callable[[ScanProgress], None] | None = None,
        receipts: ScanReceipts | None = None,
    ) -> ScanSummary:
        """Scan what the output does not hold yet; returns (and stores) the summary.

        Args:
            on_progress: called as the scan advances.
            receipts: signs the rows; required exactly when the scan was prepared with receipts.
        """
        if self.summary is not None:
            return self.summary
        if (receipts is not None) != self.receipts:
            raise ValueError("a scan prepared with receipts=True runs with a ScanReceipts, and only it")
        assert self._executor is not None  # built for every scan that is not complete
        source = self._source
        return run_scan(
            source.documents(),
            journal=self._journal,
            executor=self._executor,
            batch_docs=self._batch_docs,
            bytes_total=source.total_bytes if isinstance(source, FileSource) else None,
            docs_total=source.count() if isinstance(source, SqlSource) else None,
            skipped_files=len(source.skipped) if isinstance(source, FileSource) else 0,
            on_progress=on_progress,
            limits=self._limits,
            receipts=receipts,
        )

    def close(self) -> None:
        """Stop the workers, close the output and the database connection."""
        try:
            if self._executor is not None:
                self._executor.close()
        finally:
            self._journal.close()
            if isinstance(self._source, SqlSource):
                self._source.close()

    def abandon(self) -> None:
        """Close without running; a new output with nothing in it is removed (as when
        `prepare_scan` fails), so the same command can be run again."""
        try:
            if self._executor is not None:
                self._executor.close()
        finally:
            self._journal.abandon()
            if isinstance(self._source, SqlSource):
                self._source.close()

    def __enter__(self) -> ScanJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare_scan(
    *,
    urls: Sequence[str] = (),
    sql: str | None = None,
    query: str | None = None,
    options: SourceOptions | None = None,
    keys: Sequence[KeyMaterial],
    tokenizers: dict[str, bytes],
    out: Path,
    alpha: float = 0.01,
    min_window: int = DEFAULT_MIN_WINDOW,
    resume: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
    dask: str | None = None,
    batch_docs: int = BATCH_DOCS,
    receipts: bool = False,
) -> ScanJob:
    """Check everything and get a scan of fsspec URLs or a SQL query into `out` ready to run.

    Args:
        urls: files, directories, globs or fsspec URLs (not with `sql`).
        sql, query: a SQLAlchemy URL and a `SELECT id, text ...` query.
        options: format, jsonl/csv field, parquet column, links, the limits of one document.
        keys: keys to test (revoked ones must not be given).
        tokenizers: tokenizer.json bytes by SHA-256 for the keys' tokenizers.
        out: output file, .jsonl, .csv or .parquet (a manifest and a lock file go beside it).
        alpha: per-document family-wise significance level.
        min_window: shortest window, in scored positions; 0 scores whole documents only.
        resume, overwrite: continue the scan recorded beside `out`, or start it again.
        workers: local worker processes (0: in this process; None: one per CPU).
        dask: "local" for a LocalCluster of `workers` processes, or a scheduler address.
        batch_docs: documents per task.
        receipts: the rows get a "receipt" column (signed by the `ScanReceipts` given to
            `ScanJob.run`); pinned in the manifest, so a resume must ask for them too.

    Raises:
        InputError: bad sources, options, output, settings or cluster (nothing is scanned, and
            a new output is not left behind).
        TokenizerError: a key's tokenizer is missing.
    """
    options = options or SourceOptions()
    _check_settings(alpha, min_window, workers, batch_docs, keys)
    _check_sources(urls, sql, query)
    needed = _needed_tokenizers(keys, tokenizers)
    out = out.expanduser().absolute()
    fmt = output_format(out)
    own = [str(out.with_name(out.name + s)) for s in ("", ".manifest.json", ".spool.jsonl", ".lock")]
    _check_output_not_named(urls, own)
    source: FileSource | SqlSource = (
        SqlSource(sql, query or "", options.limits)
        if sql is not None
        else FileSource(urls, options, exclude=own)
    )
    try:
        settings = _settings(source, urls, query, options, keys, alpha, min_window, fmt)
        if receipts:  # only when set: a manifest written before the option resumes
            settings["receipts"] = True
        journal = Journal.open(out, settings=settings, resume=resume, overwrite=overwrite)
    except BaseException:
        if isinstance(source, SqlSource):
            source.close()
        raise
    if journal.complete:
        return ScanJob(source, journal, None, batch_docs, options.limits)
    config = WorkerConfig(
        keys=tuple(keys),
        tokenizers={sha: tokenizers[sha] for sha in needed},
        alpha=alpha,
        min_window=min_window,
    )
    try:
        executor = _executor(config, workers if workers is not None else _cpus(), dask)
    except BaseException:
        journal.abandon()
        if isinstance(source, SqlSource):
            source.close()
        raise
    return ScanJob(source, journal, executor, batch_docs, options.limits)


def _check_settings(
    alpha: float, min_window: int, workers: int | None, batch_docs: int, keys: Sequence[KeyMaterial]
) -> None:
    """`InputError` for a setting out of range, or no keys."""
    if not 0.0 < alpha < 1.0:
        raise InputError(f"--alpha must be between 0 and 1, got {alpha}")
    if min_window < 0:
        raise InputError(f"--window must be >= 0, got {min_window}")
    if workers is not None and workers < 0:
        raise InputError(f"--workers must be >= 0, got {workers}")
    if batch_docs < 1:
        raise InputError(f"the batch size must be >= 1, got {batch_docs}")
    if not keys:
        raise InputError("no keys to detect with: create one with `wmark keys create NAME`")


def _check_sources(urls: Sequence[str], sql: str | None, query: str | None) -> None:
    """`InputError` unless the scan reads either URLs or a --sql query (with its --query)."""
    if (sql is None) != (query is None):
        raise InputError("--sql and --query go together")
    if sql is not None and urls:
        raise InputError("scan either URLs or a --sql query, not both")


def _check_output_not_named(urls: Sequence[str], own: Sequence[str]) -> None:
    """`InputError` if an input named on the command line is one of the scan's own files: the
    output would replace it (with --overwrite, delete it). A folder or glob that holds them is
    fine: the source leaves them out."""
    mine = {os.path.realpath(p) for p in own}
    for url in urls:
        path = url.removeprefix("file://")
        if "://" not in path and os.path.realpath(os.path.expanduser(path)) in mine:
            raise InputError(f"--out (or its manifest, spool or lock) is the input {url}: write elsewhere")


def _needed_tokenizers(keys: Sequence[KeyMaterial], tokenizers: dict[str, bytes]) -> list[str]:
    """The SHA-256s of the keys' tokenizers; `TokenizerError` if one is not in `tokenizers`."""
    needed = sorted({k.spec.tokenizer.sha256 for k in keys})
    if missing := [sha[:12] for sha in needed if sha not in tokenizers]:
        raise TokenizerError(f"no tokenizer.json for {', '.join(missing)}")
    return needed


def _settings(
    source: FileSource | SqlSource,
    urls: Sequence[str],
    query: str | None,
    options: SourceOptions,
    keys: Sequence[KeyMaterial],
    alpha: float,
    min_window: int,
    fmt: str,
) -> dict[str, Any]:
    """What the manifest pins: a resumed scan must have the same."""
    settings: dict[str, Any] = {
        "sources": [_normalise(u) for u in urls],
        "sql": source.label if isinstance(source, SqlSource) else None,
        "query": query,
        "format": options.format,
        "field": options.field,
        "column": options.column,
        "keys": sorted(k.key_id for k in keys),
        "alpha": alpha,
        "min_window": min_window,
        "output_format": fmt,
    }
    if options.follow_links:  # only when set: a manifest written before the option resumes
        settings["follow_links"] = True
    if options.limits != ReadLimits():  # likewise, only when not the default
        settings["max_doc_bytes"] = options.limits.max_doc_bytes
        settings["max_ratio"] = options.limits.max_ratio
    return settings


def _executor(config: WorkerConfig, n_workers: int, dask: str | None) -> Executor:
    """The workers: a Dask cluster, this process (0 workers) or a local process pool."""
    if dask is not None:
        return DaskExecutor(config, dask, n_workers)
    if n_workers == 0:
        return InlineExecutor(config)
    return PoolExecutor(config, n_workers)


def scan(
    *,
    on_progress: Callable[[ScanProgress], None] | None = None,
    receipts: ScanReceipts | None = None,
    **kwargs: Any,
) -> ScanSummary:
    """`prepare_scan(**kwargs)`, then run it to the end; see `prepare_scan` for the arguments
    (`receipts`: sign every row with a verdict)."""
    with prepare_scan(receipts=receipts is not None, **kwargs) as job:
        return job.run(on_progress, receipts)
