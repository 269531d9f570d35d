"""`wmark audit`: verify the hash chain of the audit log, and show its latest rows."""

from __future__ import annotations

import getpass
import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from wmark.cli.common import console, err_console, open_registry, print_json

app = typer.Typer(help="Check and read the tamper-evident audit log.", no_args_is_help=True)


def cli_actor() -> str:
    """How a CLI user appears in the audit log: cli:<login name>."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"cli:uid{os.getuid()}"


def _anchor(value: str | None) -> tuple[int, str] | None:
    if value is None:
        return None
    seq, sep, row_hash = value.partition(":")
    if not sep or not seq.isdigit() or len(row_hash) != 64:
        raise typer.BadParameter("expected SEQ:HASH as printed by an earlier verify", param_hint="--anchor")
    return int(seq), row_hash.lower()


@app.command()
def verify(
    anchor: Annotated[
        str | None,
        typer.Option(
            help="SEQ:HASH from an earlier verify, kept outside the database: the log must extend it."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Replay the hash chain; exit 1 and name the first bad row if any row was edited, deleted or moved.

    \b
    Examples:
      wmark audit verify
      wmark audit verify --anchor 1200:3f9a...   (a head recorded earlier)
    """
    with open_registry() as registry:
        report = registry.audit.verify(anchor=_anchor(anchor))
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        console.print(
            f"[green]ok[/]: {report.rows} rows, chain intact; head {report.head_seq}:{report.head_hash}",
            highlight=False,
        )
    else:
        err_console.print(
            f"[bold red]audit log tampered[/]: row {report.first_bad_seq}: {escape(report.reason or '')} "
            f"({report.rows} rows verified before it)",
            highlight=False,
        )
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def tail(
    n: Annotated[int, typer.Option("-n", "--lines", min=1, max=10_000, help="How many rows.")] = 20,
    action: Annotated[str | None, typer.Option(help="Only rows of this action (e.g. detect).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per row.")] = False,
) -> None:
    """Show the latest audit rows, oldest first."""
    with open_registry() as registry:
        rows = list(reversed(registry.audit.page(limit=n, action=action)))
    if as_json:
        for row in rows:
            print_json(row.to_dict())
        return
    table = Table("seq", "time (UTC)", "actor", "action", "keys", "text sha256", "result")
    for r in rows:
        summary = ", ".join(
            f"{k}={v}" for k, v in r.result.items() if k in ("verdict", "p_value", "reason", "role")
        )
        table.add_row(
            str(r.seq),
            f"{r.at:%Y-%m-%d %H:%M:%S}",
            Text(r.actor),  # an actor is a login or token name: its brackets are not markup
            Text(r.action),
            Text(",".join(r.key_ids)),
            (r.text_sha256 or "")[:12],
            Text(summary),
        )
    console.print(table)
