"""Batch scans of document stores: read, detect in batches on workers, write rows in order.

`prepare_scan` wires a source (fsspec URLs or a SQL query), a crash-safe `Journal` and an
executor (in-process, local processes or Dask) into a `ScanJob`; `run_scan` is its loop, and
`scan` does both. The driver reads the
documents and writes the output; workers only detect, so they need neither storage nor
database credentials. Rows are committed in the sources' order, so an interrupted scan
resumed with `--resume` writes the same output as one that was never interrupted.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmark.detector.checks import check_unicode
from wmark.detector.localize import DEFAULT_MIN_WINDOW
from wmark.errors import InputError, TokenizerError
from wmark.keymaterial import KeyMaterial
from wmark.scan.journal import Journal, output_format
from wmark.scan.rows import ScanRow, ScanSummary
from wmark.scan.sources import Document, FileSource, SourceOptions, SqlSource
from wmark.scan.workers import (
    Batch,
    DaskExecutor,
    Executor,
    InlineExecutor,
    PoolExecutor,
    WorkerConfig,
)

__all__ = ["ScanJob", "ScanProgress", "prepare_scan", "run_scan", "scan"]

BATCH_DOCS = 128
BATCH_CHARS = 1 << 21  # caps what one task carries (Dask warns about large tasks)
COMMIT_ROWS = 2048
COMMIT_SECONDS = 1.0
_ATTEMPTS = 2  # a single document whose worker fails when it runs alone is retried once


@dataclass(frozen=True, kw_only=True)
class ScanProgress:
    """Where a running scan is.

    Attributes:
        documents: documents finished so far, skipped ones (already in the output) included.
        skipped: documents skipped because a previous run finished them.
        bytes_done, bytes_total: input bytes accounted for, of the total (file sources).
        docs_total: documents in the source, when known up front (SQL).
        tokens: tokens scanned by this run.
        elapsed_s: time since the scan started.
    """

    documents: int
    skipped: int
    bytes_done: int
    bytes_total: int | None
    docs_total: int | None
    tokens: int
    elapsed_s: float


@dataclass
class _Task:
    seq: int
    rows: list[ScanRow | None]
    work: Batch
    slots: list[int]
    nbytes: int
    found: list[ScanRow | None] = field(default_factory=list)  # per document of `work`


@dataclass
class _Part:
    """Documents of a task that run together on a worker: at first the whole task.

    A worker that dies fails every part the pool held, not only the one whose document killed
    it. So a part that failed among others is a suspect: it runs again alone, with nothing else
    in flight. A part that fails alone holds the cause: it is split in halves, each run alone,
    until a single document fails alone twice (its error row); everything else gets its verdict.
    """

    task: _Task
    start: int  # index of its first document in task.work
    work: Batch
    alone: bool = False  # ran with nothing else in flight
    attempts: int = 0  # failures alone, for a single document
    generation: int = 0


@dataclass
class _State:
    started: float
    documents: int = 0
    skipped: int = 0
    bytes_done: int = 0
    tokens: int = 0
    last_commit: float = field(default_factory=time.monotonic)


def _batches(
    documents: Iterator[Document],
    done: set[tuple[str, str]],
    state: _State,
    batch_docs: int,
    batch_chars: int,
) -> Iterator[_Task]:
    seq = 0
    task = _Task(seq, [], (), [], 0)
    work: list[tuple[str, str, str]] = []
    chars = 0
    for doc in documents:
        if (doc.source, doc.doc_id) in done:
            state.skipped += 1
            state.documents += 1
            state.bytes_done += doc.nbytes
            continue
        task.nbytes += doc.nbytes
        if doc.error is not None or doc.text is None:
            task.rows.append(ScanRow.failed(doc.source, doc.doc_id, doc.error or "unreadable"))
        elif not doc.text.strip():
            task.rows.append(ScanRow.failed(doc.source, doc.doc_id, "the text is empty"))
        elif (invalid := _not_unicode(doc.text)) is not None:
            task.rows.append(ScanRow.failed(doc.source, doc.doc_id, invalid))
        else:
            task.slots.append(len(task.rows))
            task.rows.append(None)
            work.append((doc.source, doc.doc_id, doc.text))
            chars += len(doc.text)
        if len(task.rows) >= batch_docs or chars >= batch_chars:
            task.work = tuple(work)
            yield task
            seq += 1
            task, work, chars = _Task(seq, [], (), [], 0), [], 0
    if task.rows:
        task.work = tuple(work)
        yield task


def _not_unicode(text: str) -> str | None:
    # A text no tokenizer takes is this document's error, found before it reaches a worker.
    try:
        check_unicode(text)
    except InputError as exc:
        return str(exc)
    return None


def run_scan(
    documents: Iterator[Document],
    *,
    journal: Journal,
    executor: Executor,
    batch_docs: int = BATCH_DOCS,
    batch_chars: int = BATCH_CHARS,
    commit_rows: int = COMMIT_ROWS,
    commit_seconds: float = COMMIT_SECONDS,
    bytes_total: int | None = None,
    docs_total: int | None = None,
    skipped_files: int = 0,
    on_progress: Callable[[ScanProgress], None] | None = None,
) -> ScanSummary:
    """Scan documents into the journal, skipping those it already holds.

    Rows are added to the journal in document order and committed every `commit_rows` rows or
    `commit_seconds`. On any exception (Ctrl-C included) the rows that are ready in order are
    committed before it propagates, so `--resume` loses nothing finished.

    Args:
        documents: what to scan, in a stable order.
        journal: the output, opened (possibly for resume).
        executor: where detection runs.
        batch_docs, batch_chars: a task's size limits.
        commit_rows, commit_seconds: how often rows are made durable.
        bytes_total, docs_total: the source's size, for progress.
        skipped_files: files of unknown format (reported in the summary).
        on_progress: called as the scan advances (after each round of finished batches).

    Returns:
        The summary, also stored in the manifest.
    """
    state = _State(started=time.monotonic())
    run_rows = 0
    tasks = _batches(documents, journal.done, state, batch_docs, batch_chars)
    in_flight: dict[Any, _Part] = {}
    suspects: deque[_Part] = deque()  # parts to run alone, one at a time, before anything new
    ready: dict[int, list[ScanRow]] = {}
    next_seq = 0
    exhausted = False
    limit = 2 * executor.slots + 1

    def progress() -> None:
        if on_progress is not None:
            on_progress(
                ScanProgress(
                    documents=state.documents,
                    skipped=state.skipped,
                    bytes_done=state.bytes_done,
                    bytes_total=bytes_total,
                    docs_total=docs_total,
                    tokens=state.tokens,
                    elapsed_s=time.monotonic() - state.started,
                )
            )

    def submit(part: _Part, *, alone: bool = False) -> None:
        part.generation = executor.generation
        part.alone = alone
        in_flight[executor.submit(part.work)] = part

    def finish(part: _Part, rows: Sequence[ScanRow]) -> None:
        found = part.task.found
        for offset, row in zip(range(len(part.work)), rows, strict=True):
            found[part.start + offset] = row
        if all(row is not None for row in found):
            complete(part.task, [row for row in found if row is not None])

    def complete(task: _Task, rows: Sequence[ScanRow]) -> None:
        nonlocal run_rows
        filled = list(task.rows)
        for slot, row in zip(task.slots, rows, strict=True):
            filled[slot] = row
        ready[task.seq] = [r for r in filled if r is not None]
        run_rows += len(task.rows)
        state.documents += len(task.rows)
        state.bytes_done += task.nbytes
        state.tokens += sum(r.n_tokens or 0 for r in rows)

    def flush(force: bool = False) -> None:
        nonlocal next_seq
        while next_seq in ready:
            journal.add(ready.pop(next_seq))
            next_seq += 1
        now = time.monotonic()
        if force or journal.pending_rows >= commit_rows or now - state.last_commit >= commit_seconds:
            journal.commit()
            state.last_commit = now

    try:
        while True:
            # read ahead while workers need work, but not past a slow batch that holds up the order
            while not suspects and not exhausted and len(in_flight) < limit and len(ready) < 4 * limit:
                task = next(tasks, None)
                if task is None:
                    exhausted = True
                elif task.work:
                    task.found = [None] * len(task.work)
                    submit(_Part(task, 0, task.work))
                else:
                    complete(task, [])
            if suspects and not in_flight:
                submit(suspects.popleft(), alone=True)
            flush()
            progress()
            if exhausted and not in_flight:
                break
            for future in executor.wait(list(in_flight), timeout=0.25):
                part = in_flight.pop(future)
                try:
                    rows = future.result()
                except Exception as exc:
                    _isolate_or_fail(part, exc, executor, suspects, finish)
                else:
                    finish(part, rows)
        flush(force=True)
    except BaseException:
        with contextlib.suppress(OSError):  # a failing disk must not hide the original error
            flush(force=True)  # keep every finished row that is in order, then let it propagate
        raise
    progress()
    elapsed = time.monotonic() - state.started
    summary = ScanSummary(
        output=str(journal.out),
        documents=journal.tally.documents,
        by_verdict=dict(sorted(journal.tally.by_verdict.items())),
        by_key=dict(sorted(journal.tally.by_key.items())),
        tokens=journal.tally.tokens,
        resumed=journal.resumed,
        run_documents=run_rows,
        run_tokens=state.tokens,
        elapsed_s=round(elapsed, 3),
        docs_per_s=round(run_rows / elapsed, 2) if elapsed > 0 else 0.0,
        tokens_per_s=round(state.tokens / elapsed, 1) if elapsed > 0 else 0.0,
        skipped_files=skipped_files,
    )
    journal.finish(summary)
    return summary


def _isolate_or_fail(
    part: _Part,
    exc: Exception,
    executor: Executor,
    suspects: deque[_Part],
    finish: Callable[[_Part, Sequence[ScanRow]], None],
) -> None:
    """Handle a failed part (see `_Part`): queue it to run alone, split it, or report it."""
    if isinstance(exc, BrokenProcessPool) and part.generation == executor.generation:
        executor.restart()  # once per broken pool: the other parts it held fail with the same
    if not part.alone:
        suspects.append(part)
    elif len(part.work) > 1:
        half = len(part.work) // 2
        suspects.appendleft(_Part(part.task, part.start + half, part.work[half:]))
        suspects.appendleft(_Part(part.task, part.start, part.work[:half]))
    else:
        part.attempts += 1
        if part.attempts < _ATTEMPTS:
            suspects.appendleft(part)
        else:
            message = f"worker failed ({type(exc).__name__}: {exc})"[:500]
            finish(part, [ScanRow.failed(source, doc_id, message) for source, doc_id, _ in part.work])


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
    """

    def __init__(
        self,
        source: FileSource | SqlSource,
        journal: Journal,
        executor: Executor | None,
        batch_docs: int,
    ) -> None:
        self._source = source
        self._journal = journal
        self._executor = executor
        self._batch_docs = batch_docs
        self.complete = journal.complete
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

    def run(self, on_progress: Callable[[ScanProgress], None] | None = None) -> ScanSummary:
        """Scan what the output does not hold yet; returns (and stores) the summary."""
        if self.summary is not None:
            return self.summary
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
) -> ScanJob:
    """Check everything and get a scan of fsspec URLs or a SQL query into `out` ready to run.

    Args:
        urls: files, directories, globs or fsspec URLs (not with `sql`).
        sql, query: a SQLAlchemy URL and a `SELECT id, text ...` query.
        options: format, jsonl/csv field, parquet column.
        keys: keys to test (revoked ones must not be given).
        tokenizers: tokenizer.json bytes by SHA-256 for the keys' tokenizers.
        out: output file, .jsonl, .csv or .parquet (a manifest and a lock file go beside it).
        alpha: per-document family-wise significance level.
        min_window: shortest window, in scored positions; 0 scores whole documents only.
        resume, overwrite: continue the scan recorded beside `out`, or start it again.
        workers: local worker processes (0: in this process; None: one per CPU).
        dask: "local" for a LocalCluster of `workers` processes, or a scheduler address.
        batch_docs: documents per task.

    Raises:
        InputError: bad sources, options, output, settings or cluster (nothing is scanned, and
            a new output is not left behind).
        TokenizerError: a key's tokenizer is missing.
    """
    options = options or SourceOptions()
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
    if (sql is None) != (query is None):
        raise InputError("--sql and --query go together")
    if sql is not None and urls:
        raise InputError("scan either URLs or a --sql query, not both")
    needed = sorted({k.spec.tokenizer.sha256 for k in keys})
    if missing := [sha[:12] for sha in needed if sha not in tokenizers]:
        raise TokenizerError(f"no tokenizer.json for {', '.join(missing)}")
    out = out.expanduser().absolute()
    fmt = output_format(out)
    own = [str(out.with_name(out.name + s)) for s in ("", ".manifest.json", ".spool.jsonl", ".lock")]
    source: FileSource | SqlSource = (
        SqlSource(sql, query or "") if sql is not None else FileSource(urls, options, exclude=own)
    )
    try:
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
        journal = Journal.open(out, settings=settings, resume=resume, overwrite=overwrite)
    except BaseException:
        if isinstance(source, SqlSource):
            source.close()
        raise
    if journal.complete:
        return ScanJob(source, journal, None, batch_docs)
    config = WorkerConfig(
        keys=tuple(keys),
        tokenizers={sha: tokenizers[sha] for sha in needed},
        alpha=alpha,
        min_window=min_window,
    )
    n_workers = workers if workers is not None else _cpus()
    try:
        executor: Executor
        if dask is not None:
            executor = DaskExecutor(config, dask, n_workers)
        elif n_workers == 0:
            executor = InlineExecutor(config)
        else:
            executor = PoolExecutor(config, n_workers)
    except BaseException:
        journal.abandon()
        if isinstance(source, SqlSource):
            source.close()
        raise
    return ScanJob(source, journal, executor, batch_docs)


def scan(*, on_progress: Callable[[ScanProgress], None] | None = None, **kwargs: Any) -> ScanSummary:
    """`prepare_scan(**kwargs)`, then run it to the end; see `prepare_scan` for the arguments."""
    with prepare_scan(**kwargs) as job:
        return job.run(on_progress)
