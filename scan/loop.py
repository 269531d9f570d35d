"""A scan's loop: tasks out to the workers, rows back into the journal in the sources' order.

`run_scan` reads ahead while workers need work, commits the rows that are ready in order every
`commit_rows` rows or `commit_seconds`, and isolates a document that kills its worker (`_Part`)
so that every other document still gets its verdict.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from wmark.scan.batches import BATCH_CHARS, BATCH_DOCS, Task, tasks
from wmark.scan.journal import Journal
from wmark.scan.limits import ReadLimits
from wmark.scan.receipts import ScanReceipts
from wmark.scan.rows import RECEIPT_COLUMNS, ScanRow, ScanSummary
from wmark.scan.sources import Document
from wmark.scan.workers import Batch, Executor

__all__ = ["COMMIT_ROWS", "COMMIT_SECONDS", "ScanProgress", "run_scan"]

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
class _Part:
    """Documents of a task that run together on a worker: at first the whole task.

    A worker that dies fails every part the pool held, not only the one whose document killed
    it. So a part that failed among others is a suspect: it runs again alone, with nothing else
    in flight. A part that fails alone holds the cause: it is split in halves, each run alone,
    until a single document fails alone twice (its error row); everything else gets its verdict.
    """

    task: Task
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

    def skip(self, doc: Document) -> None:
        """Count a document a previous run finished."""
        self.skipped += 1
        self.documents += 1
        self.bytes_done += doc.nbytes


@dataclass
class _Run:
    """The tasks of one run in flight: parts on the workers, suspects to run alone, and rows
    that wait for the rows before them."""

    tasks: Iterator[Task]
    journal: Journal
    executor: Executor
    state: _State
    commit_rows: int
    commit_seconds: float
    receipts: ScanReceipts | None = None  # signs each detected row as its task completes
    in_flight: dict[Any, _Part] = field(default_factory=dict)
    suspects: deque[_Part] = field(default_factory=deque)  # to run alone, one at a time, before anything new
    ready: dict[int, list[ScanRow]] = field(default_factory=dict)  # rows of finished tasks, by seq
    next_seq: int = 0
    exhausted: bool = False
    run_rows: int = 0
    limit: int = 0  # tasks in flight at most (and 4x that waiting in `ready`)

    def __post_init__(self) -> None:
        self.limit = 2 * self.executor.slots + 1

    @property
    def done(self) -> bool:
        """Every task was read and nothing is in flight."""
        return self.exhausted and not self.in_flight

    def fill(self) -> None:
        """Read ahead while workers need work, but not past a slow batch that holds up the order;
        a suspect runs alone, once nothing else is in flight."""
        while (
            not self.suspects
            and not self.exhausted
            and len(self.in_flight) < self.limit
            and len(self.ready) < 4 * self.limit
        ):
            task = next(self.tasks, None)
            if task is None:
                self.exhausted = True
            elif task.work:
                task.found = [None] * len(task.work)
                self._submit(_Part(task, 0, task.work))
            else:
                self._complete(task, [])
        if self.suspects and not self.in_flight:
            self._submit(self.suspects.popleft(), alone=True)

    def collect(self) -> None:
        """Take the parts that finished (waiting up to 0.25 s for one)."""
        for future in self.executor.wait(list(self.in_flight), timeout=0.25):
            part = self.in_flight.pop(future)
            try:
                rows = future.result()
            except Exception as exc:
                self._failed(part, exc)
            else:
                self._finish(part, rows)

    def flush(self, force: bool = False) -> None:
        """Add the rows that are ready in order to the journal; commit when it is time."""
        while self.next_seq in self.ready:
            self.journal.add(self.ready.pop(self.next_seq))
            self.next_seq += 1
        now = time.monotonic()
        if (
            force
            or self.journal.pending_rows >= self.commit_rows
            or now - self.state.last_commit >= self.commit_seconds
        ):
            self.journal.commit()
            self.state.last_commit = now

    def _submit(self, part: _Part, *, alone: bool = False) -> None:
        part.generation = self.executor.generation
        part.alone = alone
        try:
            future = self.executor.submit(part.work)
        except BrokenProcessPool as exc:
            # a worker died since the last collect: the pool refuses new work outright instead
            # of failing its futures, so the part fails here as it would have there
            self._failed(part, exc)
            return
        self.in_flight[future] = part

    def _finish(self, part: _Part, rows: Sequence[ScanRow]) -> None:
        found = part.task.found
        for offset, row in zip(range(len(part.work)), rows, strict=True):
            found[part.start + offset] = row
        if all(row is not None for row in found):
            self._complete(part.task, [row for row in found if row is not None])

    def _complete(self, task: Task, rows: Sequence[ScanRow]) -> None:
        if self.receipts is not None:
            sign = self.receipts.sign
            rows = [sign(row, text) for row, (_, _, text) in zip(rows, task.work, strict=True)]
        filled = list(task.rows)
        for slot, row in zip(task.slots, rows, strict=True):
            filled[slot] = row
        self.ready[task.seq] = [r for r in filled if r is not None]
        self.run_rows += len(task.rows)
        self.state.documents += len(task.rows)
        self.state.bytes_done += task.nbytes
        self.state.tokens += sum(r.n_tokens or 0 for r in rows)

    def _failed(self, part: _Part, exc: Exception) -> None:
        """Handle a failed part (see `_Part`): queue it to run alone, split it, or report it."""
        if isinstance(exc, BrokenProcessPool) and part.generation == self.executor.generation:
            self.executor.restart()  # once per broken pool: the other parts it held fail with the same
        if not part.alone:
            self.suspects.append(part)
        elif len(part.work) > 1:
            half = len(part.work) // 2
            self.suspects.appendleft(_Part(part.task, part.start + half, part.work[half:]))
            self.suspects.appendleft(_Part(part.task, part.start, part.work[:half]))
        else:
            part.attempts += 1
            if part.attempts < _ATTEMPTS:
                self.suspects.appendleft(part)
            else:
                why = "; ".join(getattr(exc, "__notes__", None) or ())  # how the worker died
                message = f"worker failed ({why + '; ' if why else ''}{type(exc).__name__}: {exc})"[:500]
                self._finish(
                    part, [ScanRow.failed(source, doc_id, message) for source, doc_id, _ in part.work]
                )


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
    limits: ReadLimits | None = None,
    receipts: ScanReceipts | None = None,
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
        limits: a text over `limits.max_doc_bytes` is an error row, never sent to a worker.
        receipts: signs every row with a verdict; given exactly when the journal's settings
            ask for receipts (its rows have the "receipt" column).

    Returns:
        The summary, also stored in the manifest.
    """
    if (receipts is not None) != (journal.columns == RECEIPT_COLUMNS):
        raise ValueError("receipts must be given exactly for a scan whose output has receipts")
    state = _State(started=time.monotonic())
    todo = tasks(documents, journal.done, state.skip, batch_docs, batch_chars, limits)
    run = _Run(todo, journal, executor, state, commit_rows, commit_seconds, receipts)

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

    try:
        while True:
            run.fill()
            run.flush()
            progress()
            if run.done:
                break
            run.collect()
        run.flush(force=True)
    except BaseException:
        with contextlib.suppress(OSError):  # a failing disk must not hide the original error
            run.flush(force=True)  # keep every finished row that is in order, then let it propagate
        raise
    progress()
    summary = _summary(journal, state, run.run_rows, skipped_files)
    journal.finish(summary)
    return summary


def _summary(journal: Journal, state: _State, run_rows: int, skipped_files: int) -> ScanSummary:
    """The output's totals and this run's figures."""
    elapsed = time.monotonic() - state.started
    return ScanSummary(
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
