"""`wmark scan`: which documents of a store carry which key; resumable, local or on Dask."""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, err_console, open_registry, print_json
from wmark.cli.options import KeyIds
from wmark.keys.audit import AuditEntry
from wmark.keys.receipt_keys import default_issuer
from wmark.receipts import ReceiptSigner
from wmark.scan.limits import DEFAULT_MAX_DOC_BYTES, DEFAULT_MAX_RATIO, ReadLimits
from wmark.scan.loop import ScanProgress
from wmark.scan.receipts import ScanReceipts
from wmark.scan.rows import ScanSummary
from wmark.scan.scan import ScanJob, prepare_scan
from wmark.scan.sources import SourceOptions

EXIT_INTERRUPTED = 130


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    # A scheduler's SIGTERM gets the same clean, resumable stop as Ctrl-C.
    def handler(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def scan(
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Output file: .jsonl, .csv or .parquet; a manifest and a lock go beside it."
        ),
    ],
    urls: Annotated[
        list[str] | None,
        typer.Argument(
            help="Files, directories (walked), globs or fsspec URLs: s3://, gs://, zip://, http(s)://, "
            "memory://... (s3/gs need s3fs/gcsfs installed; credentials come from their usual config)."
        ),
    ] = None,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="Read every file as txt, md, html, jsonl, csv or parquet. Default: by extension "
            "(.gz/.bz2/.xz are decompressed).",
        ),
    ] = None,
    field: Annotated[
        str | None, typer.Option(help="jsonl/csv: the field that holds the text (one document per record).")
    ] = None,
    column: Annotated[
        str | None, typer.Option(help="parquet: the column that holds the text (one document per row).")
    ] = None,
    follow_links: Annotated[
        bool,
        typer.Option(
            help="Read symbolic links that lead out of a scanned folder or glob, and walk linked "
            "folders. Default: such a link is an error row and is not read."
        ),
    ] = False,
    max_doc_bytes: Annotated[
        int,
        typer.Option(
            help="Largest document in bytes, after decompression (default 4 MiB): a whole file, "
            "a jsonl line, a csv record, a parquet value or a SQL text; a larger one is an error "
            "row and is never read whole. Detection needs about 130 bytes of memory per byte of "
            "text, per worker.",
        ),
    ] = DEFAULT_MAX_DOC_BYTES,
    max_ratio: Annotated[
        int,
        typer.Option(
            help="A compressed file (.gz/.bz2/.xz, zip member, parquet page) may inflate past "
            "--max-doc-bytes only up to this many times its compressed size; beyond, the rest of "
            "it is an error row (a compression bomb).",
        ),
    ] = DEFAULT_MAX_RATIO,
    sql: Annotated[
        str | None,
        typer.Option(help="Scan a SQL table instead: a SQLAlchemy URL, e.g. postgresql+psycopg://u@host/db."),
    ] = None,
    query: Annotated[
        str | None,
        typer.Option(help='With --sql: "SELECT id, text FROM ..."; the id column must be unique.'),
    ] = None,
    key: KeyIds = None,
    alpha: Annotated[
        float,
        typer.Option(help="Significance level per document, family-wise over keys, whole text and windows."),
    ] = 0.01,
    window: Annotated[
        int,
        typer.Option(
            help="Shortest window of the passage search, in scored tokens (doubling, 50% overlap); "
            "0 tests whole documents only."
        ),
    ] = 32,
    resume: Annotated[
        bool, typer.Option(help="Continue the scan recorded beside --out (after a crash or Ctrl-C).")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Start again, replacing an existing --out.")] = False,
    workers: Annotated[
        int | None,
        typer.Option(help="Worker processes (default: one per CPU; 0 runs in this process)."),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            help="Run on a Dask cluster: a scheduler address (tls://host:8786), or 'local' for a "
            "LocalCluster of --workers processes."
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Documents per task sent to a worker.")] = 128,
    receipts: Annotated[
        bool,
        typer.Option(
            "--receipts",
            help="Give every row with a verdict a signed receipt (a 'receipt' column), as "
            "`wmark detect --receipt` does; check one offline with `wmark receipt verify`. "
            "A scan started with receipts is resumed with them.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Scan a store of documents for watermarks: one row per document, resumable.

    \b
    Each document is tested whole and window by window, so a watermarked passage inside a
    long human text is found; the false-positive rate per document stays at --alpha.
    Unreadable documents get an error row and the scan goes on.
    Exit codes: 0 done, 2 bad input, 130 interrupted (continue with --resume).

    \b
    Examples:
      wmark scan reports/ --out results.jsonl
      wmark scan 's3://bucket/submissions/*.jsonl' --field text --out results.parquet
      wmark scan 'zip://*.md::archive.zip' --out results.csv --workers 4
      wmark scan --sql postgresql+psycopg://app@db/forum --query "SELECT id, body FROM posts" \\
          --out posts.jsonl --dask tcp://scheduler:8786
      wmark scan reports/ --out results.jsonl --resume
      wmark scan reports/ --out results.jsonl --receipts
    """
    options = SourceOptions(
        format=fmt,
        field=field,
        column=column,
        follow_links=follow_links,
        limits=ReadLimits(max_doc_bytes, max_ratio),
    )
    with open_registry() as registry:
        keys = registry.detection_keys(key)
        tokenizers = {sha: registry.tokenizer_json(sha) for sha in {k.spec.tokenizer.sha256 for k in keys}}
        signer = registry.receipt_keys.signer(default_issuer(), actor=cli_actor()) if receipts else None
    job = prepare_scan(
        urls=urls or [],
        sql=sql,
        query=query,
        options=options,
        keys=keys,
        tokenizers=tokenizers,
        out=out,
        alpha=alpha,
        min_window=window,
        resume=resume,
        overwrite=overwrite,
        workers=workers,
        dask=dask,
        batch_docs=batch_size,
        receipts=receipts,
    )  # every input error is raised here, before the progress bar shows
    signing = None
    if signer is not None and job.summary is None:
        try:
            seq = _audit_start(job, out, [k.key_id for k in keys], alpha, window, signer)
        except BaseException:
            job.abandon()
            raise
        signing = ScanReceipts(signer, keys, alpha=alpha, min_window=window, audit_seq=seq)
    summary = _run(job, out, signing)
    _audit(summary, [k.key_id for k in keys], alpha)
    if as_json:
        print_json(summary.to_dict())
    else:
        _table(summary)


def _run(job: ScanJob, out: Path, receipts: ScanReceipts | None) -> ScanSummary:
    """Run the scan under a progress bar (unless it is already complete); Ctrl-C or SIGTERM
    stops it cleanly, and `--resume` continues it (exit 130)."""
    progress = _progress()
    task = progress.add_task("scanning", total=None, docs=0, rate=0.0)

    def on_progress(p: ScanProgress) -> None:
        new = p.documents - p.skipped
        total = p.bytes_total if p.bytes_total else p.docs_total
        done = p.bytes_done if p.bytes_total else p.documents
        rate = new / p.elapsed_s if p.elapsed_s > 0 else 0.0
        progress.update(task, completed=done, total=total, docs=p.documents, rate=rate)

    try:
        with job, _sigterm_as_interrupt():
            if job.summary is not None:
                summary = job.summary
            else:
                with progress:
                    summary = job.run(on_progress, receipts)
    except KeyboardInterrupt:
        err_console.print(
            f"[yellow]interrupted:[/] finished documents are saved in {escape(str(out))}; "
            "continue with --resume",
            highlight=False,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    return summary


def _audit_start(
    job: ScanJob, out: Path, key_ids: list[str], alpha: float, window: int, signer: ReceiptSigner
) -> int:
    """The audit row of a run of a scan with receipts, written before its first receipt (which
    names it as `audit_seq`); the row at the end (`_audit`) certifies the results file."""
    result = {
        "output": str(out.expanduser().absolute()),
        "alpha": alpha,
        "min_window": window,
        "receipts": True,
        "receipt_kid": signer.kid,
        "resumed": job.resumed,
    }
    with open_registry() as registry:
        [row] = registry.audit.append(
            AuditEntry(actor=cli_actor(), action="scan_start", key_ids=tuple(key_ids), result=result)
        )
    return row.seq


def _audit(summary: ScanSummary, key_ids: list[str], alpha: float) -> None:
    """One audit row per finished scan (not per document): its counts and the output's SHA-256,
    so the log certifies the results file as well as the fact of the scan."""
    digest = hashlib.sha256()
    with open(summary.output, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    result = {
        "output": summary.output,
        "documents": summary.documents,
        "by_verdict": summary.by_verdict,
        "by_key": summary.by_key,
        "alpha": alpha,
        "resumed": summary.resumed,
    }
    with open_registry() as registry:
        registry.audit.append(
            AuditEntry(
                actor=cli_actor(),
                action="scan",
                key_ids=tuple(key_ids),
                text_sha256=digest.hexdigest(),
                result=result,
            )
        )


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[docs]:,} docs · {task.fields[rate]:,.0f} docs/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
    )


def _table(summary: ScanSummary) -> None:
    colour = {
        "watermarked": "green",
        "not_detected": "yellow",
        "insufficient_evidence": "dim",
        "error": "red",
    }
    table = Table(
        "verdict",
        "documents",
        title=f"scan of {summary.documents:,} documents -> {escape(str(summary.output))}",
    )
    for verdict, count in summary.by_verdict.items():
        table.add_row(f"[{colour.get(verdict, 'white')}]{verdict}[/]", f"{count:,}")
    console.print(table)
    if summary.by_key:
        keys = Table("key", "watermarked documents")
        for key_id, count in summary.by_key.items():
            keys.add_row(key_id, f"{count:,}")
        console.print(keys)
    resumed = f", {summary.resumed:,} from earlier runs" if summary.resumed else ""
    skipped = f"; {summary.skipped_files:,} files of unknown format skipped" if summary.skipped_files else ""
    console.print(
        f"this run: {summary.run_documents:,} documents, {summary.run_tokens:,} tokens in "
        f"{summary.elapsed_s:.1f} s ({summary.docs_per_s:,.1f} docs/s, {summary.tokens_per_s:,.0f} tokens/s)"
        f"{resumed}{skipped}",
        highlight=False,
    )
