"""The `wmark` command: one root Typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

from wmark import __version__
from wmark.cli import audit as audit_cmd
from wmark.cli import calibrate as calibrate_cmd
from wmark.cli import demo as demo_cmd
from wmark.cli import detect as detect_cmd
from wmark.cli import eval as eval_cmd
from wmark.cli import generate as generate_cmd
from wmark.cli import keys as keys_cmd
from wmark.cli import receipt as receipt_cmd
from wmark.cli import scan as scan_cmd
from wmark.cli import serve as serve_cmd
from wmark.cli import tokens as tokens_cmd
from wmark.cli.common import WmarkGroup
from wmark.generator.settings import prefer_huge_pages, prefer_passive_wait

app = typer.Typer(
    name="wmark",
    cls=WmarkGroup,
    help="Watermark LLM text with speculative decoding, and detect it with exact p-values.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold secrets
    add_completion=False,
)
app.command("demo")(demo_cmd.demo)
app.command("generate")(generate_cmd.generate_cmd)
app.command("eval")(eval_cmd.eval_cmd)
app.add_typer(keys_cmd.app, name="keys")
app.command("detect")(detect_cmd.detect)
app.command("scan")(scan_cmd.scan)
app.command("calibrate")(calibrate_cmd.calibrate_cmd)
app.add_typer(audit_cmd.app, name="audit")
app.add_typer(tokens_cmd.app, name="tokens")
app.add_typer(receipt_cmd.app, name="receipt")
app.command("serve")(serve_cmd.serve)
app.command("migrate")(serve_cmd.migrate)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wmark {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Watermark LLM text with speculative decoding, and detect it with exact p-values.

    Data (keys database, master key, model cache) lives in $WMARK_HOME; set WMARK_DATABASE_URL
    for PostgreSQL and WMARK_MASTER_KEY to keep the master key out of the data directory.
    """


def main() -> None:
    """Console-script entry point."""
    prefer_passive_wait()  # before any command imports torch (OpenMP reads it only then)
    prefer_huge_pages()  # likewise: torch's allocator reads it at its first allocation
    app()
