"""`wmark calibrate`: each key's false-positive rate on your own unwatermarked text, kept with the key."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
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
from wmark.errors import InputError
from wmark.eval.calibrate import CalibrationReport, CorpusText, calibrate
from wmark.eval.qq import QQ_SUFFIXES, write_qq
from wmark.scan.sources import Document, FileSource, SourceOptions
from wmark.scan.sql_source import SqlSource

DEFAULT_LIMIT = 20_000


def calibrate_cmd(
    urls: Annotated[
        list[str] | None,
        typer.Argument(
            help="Unwatermarked text, read as `wmark scan` reads it: files, directories (walked), "
            "globs or fsspec URLs (s3://, gs://, zip://, http(s)://, ...)."
        ),
    ] = None,
    fmt: Annotated[
        str | None,
        typer.Option("--format", "-f", help="As `wmark scan`: txt, md, html, jsonl, csv or parquet."),
    ] = None,
    field: Annotated[
        str | None, typer.Option(help="As `wmark scan`: the jsonl/csv field of the text.")
    ] = None,
    column: Annotated[
        str | None, typer.Option(help="As `wmark scan`: the parquet column of the text.")
    ] = None,
    follow_links: Annotated[
        bool, typer.Option(help="As `wmark scan`: read symbolic links that lead out of a folder.")
    ] = False,
    sql: Annotated[str | None, typer.Option(help="As `wmark scan`: read a SQL table instead.")] = None,
    query: Annotated[str | None, typer.Option(help='With --sql: "SELECT id, text FROM ...".')] = None,
    system_corpus: Annotated[
        int | None,
        typer.Option(
            help="Instead of URLS: the first N human-written documents found on this machine "
            "(standard-library code, licences, package docs, changelogs; near-copies dropped).",
            min=1,
        ),
    ] = None,
    key: KeyIds = None,
    alpha: Annotated[
        float, typer.Option(help="The significance level whose false-positive rate is measured.")
    ] = 0.01,
    confidence: Annotated[float, typer.Option(help="Confidence of the binomial intervals.")] = 0.99,
    limit: Annotated[int, typer.Option(help="Read at most this many documents.", min=1)] = DEFAULT_LIMIT,
    qq: Annotated[
        Path | None,
        typer.Option(
            help="Write a QQ plot of the p-values: .svg (a figure) or .csv (a table); with several keys, "
            "one file per key (the key id before the suffix)."
        ),
    ] = None,
    store: Annotated[
        bool, typer.Option(help="Keep the result with the key (`wmark keys show`, GET /v1/keys/{id}).")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON report per key on stdout.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when a key flags more documents than alpha allows.")
    ] = False,
) -> None:
    """Measure each key's false-positive rate on your own unwatermarked text, and keep it with the key.

    \b
    Every document is detected as `wmark detect` would, under each key alone. The report: the
    share at p <= alpha with its exact (Clopper-Pearson) interval and the interval that alpha
    allows, the same per length, a one-sided KS test of the p-values against the uniform, the
    smallest p-value; and how many documents were blank, unreadable, copies, near-copies or too
    short to score (counted and named, never dropped silently). Detection warns about keys never
    calibrated, or calibrated under another spec.

    \b
    Examples:
      wmark calibrate essays/ --key wk_3f9a1c2b7d4e
      wmark calibrate 's3://bucket/human/*.jsonl' --field text --qq qq.svg
      wmark calibrate --system-corpus 2000 --json
    """
    if not 0.0 < alpha < 1.0:
        raise InputError(f"--alpha must be between 0 and 1, got {alpha}")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"--confidence must be between 0 and 1, got {confidence}")
    if qq is not None and qq.suffix.lower() not in QQ_SUFFIXES:
        raise InputError(f"--qq {qq}: write a .csv table or an .svg figure")
    with open_registry() as registry:
        keys = registry.detection_keys(key)
        tokenizers = {sha: registry.tokenizer_json(sha) for sha in {k.spec.tokenizer.sha256 for k in keys}}
    with ExitStack() as stack:
        texts, total = _corpus(stack, urls or [], fmt, field, column, follow_links, sql, query, system_corpus)
        progress = _progress()
        task = progress.add_task("calibrating", total=min(total, limit) if total else None, docs=0)
        with progress:
            run = calibrate(
                _limited(texts, limit),
                keys,
                tokenizers,
                alpha=alpha,
                confidence=confidence,
                on_batch=lambda done: progress.update(task, completed=done, docs=done),
            )
    for report in run.reports:
        if qq is not None:
            path = qq if len(run.reports) == 1 else qq.with_name(f"{qq.stem}-{report.key_id}{qq.suffix}")
            write_qq(
                path, run.p_values[report.key_id], title=f"{report.key_id}: p-values", confidence=confidence
            )
    if store:
        with open_registry() as registry:
            for report in run.reports:
                registry.calibrations.add(
                    report.key_id,
                    corpus_sha256=report.corpus_sha256,
                    alpha=report.alpha,
                    n_scored=report.fpr.scored,
                    n_flagged=report.fpr.flagged,
                    report=report.to_dict(),
                    actor=cli_actor(),
                )
    for report in run.reports:
        if as_json:
            print_json(report.to_dict())
        else:
            _show(report)
    if check and not all(r.fpr.within for r in run.reports):
        raise typer.Exit(1)


def _corpus(
    stack: ExitStack,
    urls: list[str],
    fmt: str | None,
    field: str | None,
    column: str | None,
    follow_links: bool,
    sql: str | None,
    query: str | None,
    system_corpus: int | None,
) -> tuple[Iterator[CorpusText], int | None]:
    """The documents to calibrate on, and how many there are when that is known."""
    if sum(bool(x) for x in (urls, sql, system_corpus)) != 1:
        raise InputError("calibrate on URLS, a --sql query or the --system-corpus: one of them")
    if (sql is None) != (query is None):
        raise InputError("--sql and --query go together")
    if system_corpus is not None:
        from wmark.eval.corpus import system_corpus as found

        docs = found(system_corpus)
        return iter([CorpusText(d.source, d.text) for d in docs]), len(docs)
    if sql is not None:
        source = stack.enter_context(SqlSource(sql, query or ""))
        return _texts(source.documents()), source.count()
    options = SourceOptions(format=fmt, field=field, column=column, follow_links=follow_links)
    files = FileSource(urls, options)
    return _texts(files.documents()), None


def _texts(documents: Iterator[Document]) -> Iterator[CorpusText]:
    for doc in documents:
        label = f"{doc.source}#{doc.doc_id}" if doc.doc_id else doc.source
        yield CorpusText(label, doc.text, doc.error)


def _limited(texts: Iterator[CorpusText], limit: int) -> Iterator[CorpusText]:
    for i, text in enumerate(texts):
        if i >= limit:
            return
        yield text


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[docs]:,} docs"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
    )


def _show(r: CalibrationReport) -> None:
    fpr, docs = r.fpr, r.corpus
    colour = "green" if fpr.within else "red"
    console.print(
        f"[bold]{r.key_id}[/]  alpha {r.alpha}: [{colour}]{fpr.flagged} of {fpr.scored} flagged"
        f"[/] (FPR {fpr.rate:.4f}, {r.confidence:.0%} CI [{fpr.ci_low:.4f}, {fpr.ci_high:.4f}]; "
        f"alpha allows {fpr.expected_low}..{fpr.expected_high})"
        if fpr.scored
        else f"[bold]{r.key_id}[/]  no document could be scored",
        highlight=False,
    )
    console.print(
        f"  documents     {docs.read:,} read: {fpr.scored:,} scored, {r.too_short:,} too short, "
        f"{docs.duplicates:,} copies, {docs.near_duplicates:,} near-copies, "
        f"{docs.unreadable + docs.empty + docs.too_long:,} unreadable/blank/over-long",
        highlight=False,
    )
    u = r.uniformity
    if u.n:
        console.print(
            f"  p-values      one-sided KS D+ {u.statistic:.4f}, p {u.p_value:.3g}; {u.at_one:.0%} at 1; "
            f"smallest {math.exp(r.min_log_p):.3g} ({escape(r.min_p_source or '')})",
            highlight=False,
        )
    console.print(f"  corpus        sha256:{r.corpus_sha256[:16]}", highlight=False)
    if r.length_buckets:
        table = Table("scored tokens", "documents", "flagged", "FPR", f"{r.confidence:.0%} CI", box=None)
        for b in r.length_buckets:
            span = f"{b.low}-{b.high - 1}" if b.high is not None else f"{b.low}+"
            rate = b.rate
            table.add_row(
                span,
                f"{rate.scored:,}",
                f"{rate.flagged:,}",
                f"{rate.rate:.4f}",
                f"[{rate.ci_low:.4f}, {rate.ci_high:.4f}]",
            )
        console.print(table)
    for warning in r.warnings:
        err_console.print(
            f"[yellow]warning:[/] {r.key_id}: {escape(warning)}", highlight=False, soft_wrap=True
        )
