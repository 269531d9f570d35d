"""A scan's documents cut into tasks: the batches sent to workers, and the rows known up front.

A document that cannot be read, is blank, is over `--max-doc-bytes` (a SQL text, which no file
reader bounded) or is not valid Unicode gets its error row here, in the driver, and never
reaches a worker; one the output already holds is skipped. A task keeps
every document's place, so its rows are written in the sources' order once its batch returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from wmark.detector.checks import check_unicode
from wmark.errors import InputError
from wmark.scan.limits import ReadLimits, utf8_over
from wmark.scan.rows import ScanRow
from wmark.scan.sources import Document
from wmark.scan.workers import Batch

__all__ = ["BATCH_CHARS", "BATCH_DOCS", "Task", "tasks"]

BATCH_DOCS = 128
BATCH_CHARS = 1 << 21  # caps what one task carries (Dask warns about large tasks)


@dataclass
class Task:
    """Consecutive documents of the source: their rows, and the batch of those a worker detects.

    Attributes:
        seq: its place among the tasks, the order its rows are written in.
        rows: one per document; None where the worker's row goes (`slots`).
        work: the documents to detect.
        slots: the index in `rows` of each document of `work`.
        nbytes: the documents' input bytes.
        found: the worker's row per document of `work`, as they come back.
    """

    seq: int
    rows: list[ScanRow | None]
    work: Batch
    slots: list[int]
    nbytes: int
    found: list[ScanRow | None] = field(default_factory=list)


def tasks(
    documents: Iterator[Document],
    done: set[tuple[str, str]],
    skipped: Callable[[Document], None],
    batch_docs: int = BATCH_DOCS,
    batch_chars: int = BATCH_CHARS,
    limits: ReadLimits | None = None,
) -> Iterator[Task]:
    """The tasks of `documents`, in order, each of at most `batch_docs` documents or about
    `batch_chars` characters to detect; `skipped` is called for each document already `done`;
    a text over `limits.max_doc_bytes` (UTF-8) is an error row."""
    limits = limits or ReadLimits()
    seq = 0
    task = Task(seq, [], (), [], 0)
    work: list[tuple[str, str, str]] = []
    chars = 0
    for doc in documents:
        if (doc.source, doc.doc_id) in done:
            skipped(doc)
            continue
        task.nbytes += doc.nbytes
        if doc.error is not None or doc.text is None:
            task.rows.append(ScanRow.failed(doc.source, doc.doc_id, doc.error or "unreadable"))
        elif utf8_over(doc.text, limits.max_doc_bytes):
            task.rows.append(ScanRow.failed(doc.source, doc.doc_id, limits.too_big("text")))
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
            task, work, chars = Task(seq, [], (), [], 0), [], 0
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
