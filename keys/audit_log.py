"""The audit log of one database: append rows (group commit), read pages, verify the chain.

A writer takes the database's write lock before it reads the chain head (`write_transaction`;
on PostgreSQL a row lock on `audit_head`), so any number of processes append one linear chain
(the row format and the chain rule: `wmark.keys.audit`; the replay: `wmark.keys.audit_verify`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

from sqlalchemy import Table, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import InputError, WmarkError
from wmark.keys.audit import (
    HEAD_MISSING,
    AuditEntry,
    AuditLogCorrupt,
    AuditRecord,
    VerifyReport,
    canonical_json,
    record_hash,
    stored_record,
)
from wmark.keys.audit_verify import verify_chain
from wmark.keys.models import AuditEvent, AuditHead, utcnow
from wmark.keys.transactions import write_transaction

__all__ = ["AuditLog", "Precondition"]

Precondition = Callable[[Session], None]  # see AuditLog.append
_AUDIT_TABLE: Table = AuditEvent.__table__  # type: ignore[assignment]  # a Table, typed FromClause
_HEAD_TABLE: Table = AuditHead.__table__  # type: ignore[assignment]


def _head(session: Session, *, for_update: bool = False) -> tuple[int, str]:
    """The chain head's (seq, row_hash), or `AuditLogCorrupt` when it was deleted.

    Read (and written, by `_append_locked`) through SQLAlchemy Core: an ORM object for the head
    cost a load and a unit-of-work flush, ~0.3 ms of CPU per group commit."""
    query = select(_HEAD_TABLE.c.seq, _HEAD_TABLE.c.row_hash).where(_HEAD_TABLE.c.id == 1)
    row = session.connection().execute(query.with_for_update() if for_update else query).one_or_none()
    if row is None:
        raise AuditLogCorrupt(f"{HEAD_MISSING}: run `wmark audit verify`")
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
        result_json = canonical_json(entry.result)
        result = json.loads(result_json)  # what is stored is what is hashed
        seq += 1
        record = AuditRecord(
            seq=seq,
            at=at,
            actor=entry.actor,
            action=entry.action,
            key_ids=tuple(key_ids),
            text_sha256=entry.text_sha256,
            result=result,
            prev_hash=prev_hash,
            row_hash="",
        )
        record = replace(record, row_hash=record_hash(record))
        rows.append({**record.to_dict(), "at": at, "key_ids": canonical_json(key_ids), "result": result_json})
        out.append(record)
        prev_hash = record.row_hash
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
        """Rows newest first: at most `limit`, with seq < `before`, of one `action` if given.

        Only the chain's rows, 1 to the head: a row numbered outside them was written around
        the audit writer (`verify` names it), and is never served as an event."""
        if not 1 <= limit <= 10_000:
            raise InputError("limit must be between 1 and 10000")
        query = select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(limit)
        if before is not None:
            query = query.where(AuditEvent.seq < before)
        if action is not None:
            query = query.where(AuditEvent.action == action)
        with self.sessions() as session:
            query = query.where(AuditEvent.seq.between(1, _head(session)[0]))
            return [stored_record(row) for row in session.scalars(query)]

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
        with self.sessions() as session:
            return verify_chain(session, anchor=anchor)
