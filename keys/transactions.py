"""Transactions on the registry database: writers queued on one lock, readers on one snapshot.

A writer (`write_transaction`) takes the database's write lock before its first statement
(BEGIN IMMEDIATE on SQLite; PostgreSQL's row locks are taken by the statements themselves), so
that any number of processes can append one linear audit chain. A reader (`read_snapshot`) sees
the database as of one moment while writers go on.
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["read_snapshot", "write_transaction"]


class _WriterLock:
    """Queues the writers of one database: the threads of this process, then (for a SQLite file)
    the processes, on an flock of `<database>.writelock`.

    Without it, writers wait inside SQLite's busy handler, which polls with sleeps of up to
    100 ms: with several worker processes a writer can lose the race for seconds. A thread lock
    and a blocking flock wake the next writer as soon as the lock is free.
    """

    def __init__(self, engine: Engine) -> None:
        self._threads = threading.Lock()
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        self._path = f"{database}.writelock" if database and database != ":memory:" else None
        self._fd: int | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._threads:
            if self._path is None:
                yield
                return
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
                weakref.finalize(self, os.close, self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)


_writer_locks: WeakKeyDictionary[Engine, _WriterLock] = WeakKeyDictionary()
_writer_locks_guard = threading.Lock()


def _writer_lock(engine: Engine) -> _WriterLock:
    with _writer_locks_guard:
        lock = _writer_locks.get(engine)
        if lock is None:
            lock = _writer_locks[engine] = _WriterLock(engine)
        return lock


@contextmanager
def write_transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A transaction that holds the database's write lock from its first statement.

    SQLite would otherwise start a deferred transaction, read, and fail to upgrade to a write
    lock under contention; BEGIN IMMEDIATE takes it first. Writers queue on `_WriterLock`
    before that, so they rarely meet SQLite's polling busy handler at all.
    """
    engine = sessions.kw["bind"]
    with _writer_lock(engine).hold(), sessions.begin() as session:
        conn = session.connection()
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield session


def read_snapshot(session: Session) -> None:
    """Make every later read of `session` see one snapshot of the database."""
    if session.get_bind().dialect.name == "sqlite":
        # pysqlite runs SELECTs outside a transaction; an explicit one pins a WAL snapshot
        session.connection().exec_driver_sql("BEGIN")
    else:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
