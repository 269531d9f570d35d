"""Engines, sessions and schema migrations (Alembic, run programmatically).

SQLite (the default) gets WAL, a busy timeout and foreign keys, and its file the guards of
`wmark.keys.sqlite_file`; PostgreSQL runs migrations under an advisory lock so that several
processes starting at once cannot race each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from wmark.errors import KeyRegistryError
from wmark.keys.config import DatabaseTimeouts
from wmark.keys.db_timeouts import bound_engine, engine_arguments
from wmark.keys.sqlite_file import guard_sqlite_file

__all__ = ["downgrade", "head_revision", "make_engine", "make_sessionmaker", "schema_revision", "upgrade"]

_MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(url: str, timeouts: DatabaseTimeouts | None = None) -> Engine:
    """An engine for `url`, with SQLite tuned for concurrent readers and one writer, and every
    wait on the database bounded by `timeouts` (default `DatabaseTimeouts()`; `db_timeouts`)."""
    timeouts = DatabaseTimeouts() if timeouts is None else timeouts
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise KeyRegistryError(f"invalid database URL: {exc}") from exc
    if parsed.get_backend_name() != "sqlite":
        bounded = create_engine(
            url, pool_pre_ping=True, **engine_arguments(parsed.get_backend_name(), timeouts)
        )
        bound_engine(bounded, timeouts)
        return bounded
    kwargs = engine_arguments("sqlite", timeouts)
    if parsed.database in (None, "", ":memory:"):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database
    else:
        kwargs["pool_timeout"] = timeouts.pool
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    if parsed.database and "poolclass" not in kwargs:  # a file: created whole, refused empty, named damaged
        guard_sqlite_file(engine, Path(parsed.database).expanduser())

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={round(timeouts.statement * 1000)}")
        if parsed.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Session factory; objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    """The newest migration this release ships."""
    head = ScriptDirectory.from_config(_alembic_config(create_engine("sqlite://"))).get_current_head()
    assert head is not None  # the package always ships migrations
    return head


def schema_revision(engine: Engine) -> str | None:
    """The migration the database is at (None for an empty database)."""
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()  # psycopg lists each address it tried
        raise KeyRegistryError(f"cannot reach the database: {reason[0] if reason else exc}") from exc


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the schema to `revision` (idempotent)."""
    if revision == "head" and schema_revision(engine) == head_revision():
        return
    try:
        command.upgrade(_alembic_config(engine), revision)
    except DatabaseError as exc:  # e.g. a damaged file whose schema table was lost
        raise KeyRegistryError(f"migrating the registry database failed: {exc.orig}") from exc


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Migrate the schema down to `revision` (for migration tests)."""
    command.downgrade(_alembic_config(engine), revision)
