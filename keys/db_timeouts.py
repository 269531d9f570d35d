"""Bounded waits on the registry's database (`DatabaseTimeouts`), wired into an engine.

A PostgreSQL that does not answer used to hang whoever asked: psycopg waits 130 s to connect by
default, a stopped server (SIGSTOP, a frozen VM, a dead network path) keeps its connections open
so a query on one waits forever, and a full pool waits 30 s per request. Here:

- connecting gives up after `connect` seconds (libpq's `connect_timeout`);
- the server cancels a statement after `statement` seconds (`SET statement_timeout` on each new
  connection: also through PgBouncer, which refuses the `options` start-up parameter);
- the client gives up on any answer it has waited `statement + connect` seconds for (psycopg's
  own wait, bounded; the connection is closed, so the pool drops it): what bounds a server that
  stopped answering;
- a free connection of the pool is waited for `pool` seconds;
- SQLite waits `statement` seconds for another writer's lock (its busy timeout).

Each gives an `OperationalError` (the pool's `TimeoutError` for the pool): the service answers
503, the CLI one line and exit code 2. Migrations, which may rightly run long, lift the statement
bounds on their own connection (`unbounded`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, event, text

from wmark.keys.config import DatabaseTimeouts

__all__ = ["BoundedConnection", "bound_engine", "engine_arguments", "unbounded"]


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection that waits at most `answer_timeout` seconds for any answer.

    psycopg's `Connection.wait` runs every exchange with the server (query, commit, rollback, the
    pool's ping) and takes a timeout; this one always passes one. On expiry the connection is
    closed (its state is unknown), which SQLAlchemy reads as a disconnect: the pool drops it.
    """

    answer_timeout: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.answer_timeout if timeout is None else timeout
        try:
            return super().wait(gen, interval, limit)
        except psycopg.OperationalError as exc:
            if limit is not None and not self.closed and _is_wait_timeout(exc):
                self.pgconn.finish()
                raise psycopg.OperationalError(f"the database did not answer within {limit:g} s") from None
            raise


def _is_wait_timeout(exc: Exception) -> bool:
    # psycopg's own wait timeout (`psycopg.errors._WaitTimeout`, an OperationalError) is private
    return type(exc).__name__ == "_WaitTimeout"


def engine_arguments(backend: str, timeouts: DatabaseTimeouts) -> dict[str, Any]:
    """`create_engine` arguments for a `backend` ("postgresql", "sqlite", ...) engine (a pooled
    SQLite engine, of a file, also takes `pool_timeout`)."""
    if backend == "sqlite":
        return {"connect_args": {"timeout": timeouts.statement, "check_same_thread": False}}
    # libpq counts whole seconds (and at least 2)
    return {
        "pool_timeout": timeouts.pool,
        "connect_args": {"connect_timeout": max(2, math.ceil(timeouts.connect))},
    }


def bound_engine(engine: Engine, timeouts: DatabaseTimeouts) -> None:
    """Install the server-side statement timeout and the client's answer timeout on a PostgreSQL
    engine (psycopg driver: the answer timeout; other drivers: the statement timeout only)."""
    if engine.dialect.name != "postgresql":
        return
    answer_timeout = timeouts.statement + timeouts.connect
    statement_ms = max(1, round(timeouts.statement * 1000))

    if engine.dialect.driver == "psycopg":

        @event.listens_for(engine, "do_connect")
        def _bounded_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
            conn = BoundedConnection.connect(*cargs, **cparams)
            conn.answer_timeout = answer_timeout
            return conn

    @event.listens_for(engine, "connect")
    def _statement_timeout(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute(f"SET statement_timeout = {statement_ms}")
        cursor.close()
        dbapi_conn.commit()


@contextmanager
def unbounded(connection: Connection) -> Iterator[None]:
    """No statement or answer timeout on `connection` inside the block (migrations: an index over
    a long audit log may take minutes); restored after it. Connecting stays bounded."""
    if connection.dialect.name != "postgresql":
        yield
        return
    driver = connection.connection.driver_connection
    previous = getattr(driver, "answer_timeout", None)
    setting = connection.execute(text("SHOW statement_timeout")).scalar_one()
    connection.execute(text("SET statement_timeout = 0"))
    connection.commit()
    if isinstance(driver, BoundedConnection):
        driver.answer_timeout = None
    try:
        yield
    finally:
        if isinstance(driver, BoundedConnection):
            driver.answer_timeout = previous
        connection.execute(text("SELECT set_config('statement_timeout', :value, false)"), {"value": setting})
        connection.commit()
