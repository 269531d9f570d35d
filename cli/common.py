"""Shared CLI plumbing: the error boundary, registry access and output helpers."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from typer.core import TyperGroup

from wmark.errors import WmarkError
from wmark.keys import KeyRegistry

__all__ = [
    "WmarkGroup",
    "console",
    "embedded_tokenizer_loader",
    "err_console",
    "fail",
    "open_registry",
    "print_json",
]

console = Console()
err_console = Console(stderr=True)


class WmarkGroup(TyperGroup):
    """Root command group: every `WmarkError`, a database that does not answer (in time) and an
    operating-system error (a full disk or stdout) become one line on stderr and exit code 2."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except WmarkError as exc:
            raise fail(str(exc)) from None
        except (OperationalError, PoolTimeout) as exc:
            # the driver's first line (it names the host, never the password); not the SQL
            cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            raise fail(f"the database is unavailable: {cause[0] if cause else type(exc).__name__}") from None
        except BrokenPipeError:  # the reader of stdout went away (`| head`): nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            raise typer.Exit(1) from None
        except OSError as exc:  # a full disk or stdout, a file that cannot be written: one line
            where = f"{exc.filename}: " if exc.filename else ""
            raise fail(f"{where}{exc.strerror or exc}") from None


def open_registry() -> KeyRegistry:
    """The registry configured by WMARK_HOME / WMARK_DATABASE_URL / WMARK_MASTER_KEY."""
    return KeyRegistry.open()


def embedded_tokenizer_loader() -> Any:
    """Loader of the embedded pair's tokenizer.json, or None without the `[models]` extra."""
    try:
        from wmark.generator.models.embedded import embedded_tokenizer_json
    except ImportError:
        return None
    return embedded_tokenizer_json


def print_json(data: Any) -> None:
    """One JSON object per line on stdout."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2).

    The message is printed as plain text: a path or an extra such as `wmark[models]` is not markup.
    """
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)
