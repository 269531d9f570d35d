"""The SQLite registry file: created whole, never adopted when empty, named when damaged.

SQLite turns any empty file into a new, empty database, and reports a file that is not one (or
whose pages are damaged) as a driver error deep in whatever query met it. A 0-byte `wmark.db` is
what a failed copy, a full disk or a truncating editor leaves; adopting it would hide every key
the registry held. So a new registry file is written complete (a SQLite header, in WAL mode)
under a temporary name and linked into place, a file is never seen empty by another process, and
an empty file found where a registry is expected is refused. A damaged file becomes one
`RegistryDamagedError` (CLI: one line and exit 2; service: 503) wherever it is met.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

from wmark.errors import KeyRegistryError

__all__ = ["RegistryDamagedError", "guard_sqlite_file"]

# Primary result codes of a file that is not a SQLite database, or one with damaged pages.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class RegistryDamagedError(KeyRegistryError):
    """The registry's SQLite file is empty, not a database, or damaged."""

    code = "registry_damaged"
    status = 503


def guard_sqlite_file(engine: Engine, path: Path) -> None:
    """Make `engine` (SQLite on the file `path`) create the file whole, refuse it empty, and name
    it when it is damaged."""

    @event.listens_for(engine, "do_connect")
    def _before_connect(*_args: Any) -> None:
        _create_or_check(path)

    @event.listens_for(engine, "handle_error")
    def _damaged(context: ExceptionContext) -> BaseException | None:
        exc = context.original_exception
        if isinstance(exc, sqlite3.DatabaseError) and (
            getattr(exc, "sqlite_errorcode", 0) & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
        ):
            return RegistryDamagedError(
                f"the registry database {path} is damaged ({exc}): restore it from a backup, "
                "or move it away to start a new, empty registry"
            )
        return None


def _create_or_check(path: Path) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        _create(path)
        return
    if size == 0:
        raise RegistryDamagedError(
            f"the registry database {path} is an empty file (0 bytes), not a registry: restore it "
            f"from a backup, or delete it (rm {path}) to start a new, empty registry"
        )


def _create(path: Path) -> None:
    """A new database file, complete before it appears under its name (a race of several
    processes creating it is won by one; the others open the winner's file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{secrets.token_hex(6)}.new")
    try:
        conn = sqlite3.connect(staging)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # writes the header: the file is a database
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):  # another process created it first
            os.link(staging, path)
    finally:
        staging.unlink(missing_ok=True)
