"""The audit log: append-only, hash-chained, written under a database lock.

Every detection, key change, token change and failed authentication is one row: time, actor,
action, key ids, the SHA-256 of the text (never the text) and a result object. Rows are chained:

    row_hash = SHA-256(prev_hash || canonical(row))

where canonical(row) is JSON with sorted keys, no spaces and ASCII escapes, so that one row has
exactly one serialisation. A writer takes the database's write lock before it reads the chain
head (BEGIN IMMEDIATE on SQLite; a row lock on `audit_head` on PostgreSQL), so any number of
processes append one linear chain. `verify` replays the chain and names the first row that was
edited, deleted or moved. Someone who can rewrite the whole table and the head can rebuild a
consistent chain: record `verify`'s head hash outside the database and pass it back as an anchor.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine, Table, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import InputError, KeyRegistryError, WmarkError
from wmark.keys.models import AuditEvent, AuditHead, utcnow

__all__ = [
    "GENESIS",
    "AuditEntry",
    "AuditLog",
    "AuditLogCorrupt",
    "AuditRecord",
    "VerifyReport",
    "canonical_row",
    "chain_hash",
    "detection_entry",
    "text_digest",
    "write_transaction",
]

GENESIS = "0" * 64  # prev_hash of the first row
Precondition = Callable[[Session], None]  # see AuditLog.append
_VERIFY_CHUNK = 1000
_AUDIT_TABLE: Table = AuditEvent.__table__  # type: ignore[assignment]  # a Table, typed FromClause
_HEAD_TABLE: Table = AuditHead.__table__  # type: ignore[assignment]


class AuditLogCorrupt(KeyRegistryError):
    """The audit log cannot be read or extended: a row is malformed or the chain head is gone.

    The service answers 503 with this message instead of writing past the damage (a detection
    that cannot be audited is not answered); `wmark audit verify` names the first bad row.
    """

    code = "audit_log_corrupt"
    status = 503

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


def text_digest(text: str) -> str:
    """SHA-256 hex of the UTF-8 text: what the log keeps instead of the text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become strings (JSON has no inf/nan).

    The exact built-in types are told apart by `type()` first: the ABC checks below cost ~10x
    more, and a group commit copies every row about twice."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if kind is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(
        _plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """What a caller appends (the log adds seq, time and hashes).

    Attributes:
        actor: who did it ("token:<id>", "cli:<user>", "anonymous").
        action: what ("detect", "scan", "key_create", "key_rotate", "key_revoke", "token_create",
            "token_revoke", "auth_failed").
        key_ids: keys involved.
        text_sha256: SHA-256 of the text detected, for detections; of the results file, for scans.
        result: JSON-ready outcome (verdict, p-value, status, reason ...).
    """

    actor: str
    action: str
    key_ids: tuple[str, ...] = ()
    text_sha256: str | None = None
    result: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One stored row of the log."""

    seq: int
    at: datetime
    actor: str
    action: str
    key_ids: tuple[str, ...]
    text_sha256: str | None
    result: dict[str, Any]
    prev_hash: str
    row_hash: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "key_ids": list(self.key_ids),
            "text_sha256": self.text_sha256,
            "result": self.result,
            "prev_hash": self.prev_hash,
            "row_hash": self.row_hash,
        }


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """Outcome of `AuditLog.verify`.

    Attributes:
        ok: the chain is intact (and extends the anchor, if one was given).
        rows: rows read.
        head_seq, head_hash: the last row's sequence number and hash (record these elsewhere).
        first_bad_seq: sequence number of the first bad (edited, missing or moved) row.
        reason: what is wrong with it.
    """

    ok: bool
    rows: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "ok": self.ok,
            "rows": self.rows,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
        }


def canonical_row(
    *,
    seq: int,
    at: datetime,
    actor: str,
    action: str,
    key_ids: Sequence[str],
    text_sha256: str | None,
    result: Mapping[str, Any],
) -> bytes:
    """The one serialisation of a row that its hash covers (version-tagged canonical JSON)."""
    return _dumps(
        {
            "v": 1,
            "seq": seq,
            "at": at.isoformat(timespec="microseconds"),
            "actor": actor,
            "action": action,
            "key_ids": list(key_ids),
            "text_sha256": text_sha256,
            "result": result,
        }
    ).encode("ascii")


def chain_hash(prev_hash: str, canonical: bytes) -> str:
    """SHA-256(prev_hash || canonical row), hex."""
    return hashlib.sha256(prev_hash.encode("ascii") + canonical).hexdigest()


_DETECTION_FIELDS = ("verdict", "p_value", "log_p", "key_id", "n_scored", "n_tokens", "alpha")


def detection_entry(
    *,
    actor: str,
    key_ids: Sequence[str],
    text_sha256: str,
    detection: Mapping[str, Any],
    input_kind: str = "text",
) -> AuditEntry:
    """The audit entry of one detection (the same for the CLI and the service).

    Args:
        actor: who asked.
        key_ids: every key tested.
        text_sha256: SHA-256 of the input (`text_digest`), never the input itself.
        detection: `Detection.to_dict()`; its verdict, p-value, matched key and counts are kept.
        input_kind: "text" or "token_ids".
    """
    result = {"input": input_kind, **{k: detection[k] for k in _DETECTION_FIELDS}}
    return AuditEntry(
        actor=actor, action="detect", key_ids=tuple(key_ids), text_sha256=text_sha256, result=result
    )


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


def _read_snapshot(session: Session) -> None:
    """Make every later read of `session` see one snapshot of the database."""
    if session.get_bind().dialect.name == "sqlite":
        # pysqlite runs SELECTs outside a transaction; an explicit one pins a WAL snapshot
        session.connection().exec_driver_sql("BEGIN")
    else:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def _decoded(row: AuditEvent) -> tuple[list[str], dict[str, Any]]:
    """The row's key ids and result, or `AuditLogCorrupt` naming the row and the bad column."""
    try:
        key_ids = json.loads(row.key_ids)
        if not isinstance(key_ids, list) or not all(isinstance(k, str) for k in key_ids):
            raise ValueError("not a list of strings")
    except (TypeError, ValueError):
        detail = "key_ids is not a JSON list of key ids"
        raise AuditLogCorrupt(f"audit row {row.seq}: {detail}", detail=detail) from None
    try:
        result = json.loads(row.result)
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except (TypeError, ValueError):
        detail = "result is not a JSON object"
        raise AuditLogCorrupt(f"audit row {row.seq}: {detail}", detail=detail) from None
    return key_ids, result


def _record(row: AuditEvent) -> AuditRecord:
    key_ids, result = _decoded(row)
    return AuditRecord(
        seq=row.seq,
        at=row.at,
        actor=row.actor,
        action=row.action,
        key_ids=tuple(key_ids),
        text_sha256=row.text_sha256,
        result=result,
        prev_hash=row.prev_hash,
        row_hash=row.row_hash,
    )


def _row_hash(row: AuditEvent) -> str:
    key_ids, result = _decoded(row)
    canonical = canonical_row(
        seq=row.seq,
        at=row.at,
        actor=row.actor,
        action=row.action,
        key_ids=key_ids,
        text_sha256=row.text_sha256,
        result=result,
    )
    return chain_hash(row.prev_hash, canonical)


_HEAD_MISSING = "the chain head (table audit_head) is missing"


def _head(session: Session, *, for_update: bool = False) -> tuple[int, str]:
    """The chain head's (seq, row_hash), or `AuditLogCorrupt` when it was deleted.

    Read (and written, by `_append_locked`) through SQLAlchemy Core: an ORM object for the head
    cost a load and a unit-of-work flush, ~0.3 ms of CPU per group commit."""
    query = select(_HEAD_TABLE.c.seq, _HEAD_TABLE.c.row_hash).where(_HEAD_TABLE.c.id == 1)
    row = session.connection().execute(query.with_for_update() if for_update else query).one_or_none()
    if row is None:
        raise AuditLogCorrupt(f"{_HEAD_MISSING}: run `wmark audit verify`")
    return int(row.seq), str(row.row_hash)


def _append_locked(
    session: Session, head: tuple[int, str], entries: Sequence[AuditEntry]
) -> list[AuditRecord]:
    """Append after `head` (locked by this transaction) and move the head to the last new row."""
    if not entries:
        return []
    out, rows = [], []
    seq, prev_hash = head
    for entry in entries:
        at = utcnow()
        key_ids = [str(k) for k in entry.key_ids]
        result_json = _dumps(entry.result)
        result = json.loads(result_json)  # what is stored is what is hashed
        seq += 1
        row_hash = chain_hash(
            prev_hash,
            canonical_row(
                seq=seq,
                at=at,
                actor=entry.actor,
                action=entry.action,
                key_ids=key_ids,
                text_sha256=entry.text_sha256,
                result=result,
            ),
        )
        record = AuditRecord(
            seq=seq,
            at=at,
            actor=entry.actor,
            action=entry.action,
            key_ids=tuple(key_ids),
            text_sha256=entry.text_sha256,
            result=result,
            prev_hash=prev_hash,
            row_hash=row_hash,
        )
        rows.append({**record.to_dict(), "at": at, "key_ids": _dumps(key_ids), "result": result_json})
        out.append(record)
        prev_hash = row_hash
    conn = session.connection()
    conn.execute(insert(_AUDIT_TABLE), rows)
    conn.execute(update(_HEAD_TABLE).where(_HEAD_TABLE.c.id == 1).values(seq=seq, row_hash=prev_hash))
    return out


class AuditLog:
    """The audit log of one database.

    Args:
        sessions: session factory of a migrated registry database.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._queue: list[tuple[Sequence[AuditEntry], Precondition | None, Future[list[AuditRecord]]]] = []
        self._turn = threading.Condition()
        self._writing = False

    def append(self, *entries: AuditEntry, precondition: Precondition | None = None) -> list[AuditRecord]:
        """Append entries, in order, and return their rows once committed.

        Group commit: threads of one process that append at the same time share one locked
        transaction (and one fsync). The first caller writes everything queued so far, its own
        entries included; the others wait for their rows, and one of any still queued writes next.

        Args:
            entries: the rows to write.
            precondition: called in the write transaction, under the lock, before the entries are
                written; a `WmarkError` it raises is this caller's (its entries are not written,
                the others' are). The service checks there that the token it authenticated from a
                cache is still unrevoked, so an answer is only ever audited, and given, under a
                token valid at that moment.
        """
        mine: Future[list[AuditRecord]] = Future()
        with self._turn:
            self._queue.append((entries, precondition, mine))
            while self._writing and not mine.done():
                self._turn.wait()
            if mine.done():
                return mine.result()
            self._writing = True
            batch, self._queue = self._queue, []
        try:
            with write_transaction(self.sessions) as session:
                written = self._append_group(session, batch)
        except BaseException as exc:
            for _, _, waiter in batch:
                waiter.set_exception(exc)
        else:
            for (_, _, waiter), records in zip(batch, written, strict=True):
                if isinstance(records, WmarkError):
                    waiter.set_exception(records)
                else:
                    waiter.set_result(records)
        finally:
            with self._turn:
                self._writing = False
                self._turn.notify_all()
        return mine.result()

    def _append_group(
        self,
        session: Session,
        batch: Sequence[tuple[Sequence[AuditEntry], Precondition | None, object]],
    ) -> list[list[AuditRecord] | WmarkError]:
        """Every caller's precondition, then all admitted callers' rows in one insert: each
        caller gets its rows, or the `WmarkError` its precondition raised.

        The chain head is locked first, so that the preconditions see what every earlier writer
        committed and nothing can commit after them (on PostgreSQL the head's row lock is the
        write lock; SQLite's BEGIN IMMEDIATE already holds it)."""
        head = _head(session, for_update=True)
        outcome: list[list[AuditRecord] | WmarkError] = []
        admitted: list[AuditEntry] = []
        for entries, precondition, _ in batch:
            try:
                if precondition is not None:
                    precondition(session)
            except WmarkError as exc:
                outcome.append(exc)
                continue
            outcome.append([])
            admitted.extend(entries)
        records = iter(_append_locked(session, head, admitted))
        for (entries, _, _), mine in zip(batch, outcome, strict=True):
            if isinstance(mine, list):
                mine.extend(next(records) for _ in entries)
        return outcome

    @staticmethod
    def append_in(session: Session, entries: Sequence[AuditEntry]) -> list[AuditRecord]:
        """Append within a transaction opened by `write_transaction` (so a change and its row
        commit together).

        One multi-row INSERT through SQLAlchemy Core (no ORM object per row: the unit of work
        cost ~0.2 ms of CPU a row) and one update of the chain head.
        """
        return _append_locked(session, _head(session, for_update=True), entries)

    def tail(self, n: int = 20) -> list[AuditRecord]:
        """The last `n` rows, oldest first."""
        return list(reversed(self.page(limit=n)))

    def page(
        self, *, limit: int = 100, before: int | None = None, action: str | None = None
    ) -> list[AuditRecord]:
        """Rows newest first: at most `limit`, with seq < `before`, of one `action` if given."""
        if not 1 <= limit <= 10_000:
            raise InputError("limit must be between 1 and 10000")
        query = select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(limit)
        if before is not None:
            query = query.where(AuditEvent.seq < before)
        if action is not None:
            query = query.where(AuditEvent.action == action)
        with self.sessions() as session:
            return [_record(row) for row in session.scalars(query)]

    def count(self) -> int:
        """Rows in the log, per the chain head."""
        with self.sessions() as session:
            return _head(session)[0]

    def verify(self, *, anchor: tuple[int, str] | None = None) -> VerifyReport:
        """Replay the chain from the first row.

        Args:
            anchor: (seq, row_hash) recorded from an earlier `verify`; the log must still
                contain that exact row.

        Returns:
            The report; `first_bad_seq` names the first row that was edited, deleted (the
            missing sequence number) or moved.
        """
        prev_hash, expected, rows = GENESIS, 1, 0
        anchor_seen = anchor is None or anchor[0] == 0

        def bad(seq: int, reason: str) -> VerifyReport:
            return VerifyReport(
                ok=False,
                rows=rows,
                head_seq=expected - 1,
                head_hash=prev_hash,
                first_bad_seq=seq,
                reason=reason,
            )

        with self.sessions() as session:
            _read_snapshot(session)  # the head and the rows as of one moment, while writers go on
            head = session.scalars(select(AuditHead).where(AuditHead.id == 1)).one_or_none()
            last = 0
            while True:
                chunk = list(
                    session.scalars(
                        select(AuditEvent)
                        .where(AuditEvent.seq > last)
                        .order_by(AuditEvent.seq)
                        .limit(_VERIFY_CHUNK)
                    )
                )
                if not chunk:
                    break
                for row in chunk:
                    if row.seq != expected:
                        gap = f"{expected}" if row.seq == expected + 1 else f"{expected}..{row.seq - 1}"
                        return bad(expected, f"row {gap} is missing (deleted or renumbered)")
                    if row.prev_hash != prev_hash:
                        return bad(row.seq, "prev_hash does not match the previous row (moved or replaced)")
                    try:
                        edited = _row_hash(row) != row.row_hash
                    except AuditLogCorrupt as exc:
                        return bad(row.seq, f"{exc.detail} (edited)")
                    if edited:
                        return bad(row.seq, "contents do not match the row hash (edited)")
                    if anchor is not None and row.seq == anchor[0]:
                        if row.row_hash != anchor[1]:
                            return bad(row.seq, "row differs from the anchor recorded earlier")
                        anchor_seen = True
                    prev_hash, expected, rows = row.row_hash, expected + 1, rows + 1
                last = chunk[-1].seq
                session.expunge_all()
            if head is None:
                return bad(expected - 1, f"{_HEAD_MISSING} (deleted)")
            if head.seq > expected - 1:
                return bad(expected, f"rows {expected}..{head.seq} are missing (the log was truncated)")
            if head.seq < expected - 1:
                return bad(head.seq + 1, "rows after the recorded head were added outside the audit writer")
            if head.row_hash != prev_hash:
                return bad(head.seq, "the last row does not match the recorded chain head")
            if anchor is not None and not anchor_seen:
                return bad(anchor[0], "the anchor row is beyond the end of the log")
        return VerifyReport(ok=True, rows=rows, head_seq=expected - 1, head_hash=prev_hash)
