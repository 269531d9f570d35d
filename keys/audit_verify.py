"""Replaying the audit chain: the first row that was edited, deleted or moved.

The replay reads one snapshot of the database (writers go on meanwhile), a chunk of rows at a
time, and checks each row's sequence number, its link to the row before and its hash (the chain
rule: `wmark.keys.audit`), then the chain head, and the anchor if one was recorded earlier.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from wmark.keys.audit import GENESIS, HEAD_MISSING, AuditLogCorrupt, VerifyReport, record_hash, stored_record
from wmark.keys.models import AuditEvent, AuditHead
from wmark.keys.transactions import read_snapshot

__all__ = ["verify_chain"]

_VERIFY_CHUNK = 1000


def verify_chain(session: Session, *, anchor: tuple[int, str] | None = None) -> VerifyReport:
    """Replay the chain from the first row (see `AuditLog.verify`), in `session`."""
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

    read_snapshot(session)  # the head and the rows as of one moment, while writers go on
    head = session.scalars(select(AuditHead).where(AuditHead.id == 1)).one_or_none()
    last: int | None = None  # from the lowest row: one numbered below 1 is forged too
    while True:
        query = select(AuditEvent).order_by(AuditEvent.seq).limit(_VERIFY_CHUNK)
        chunk = list(session.scalars(query if last is None else query.where(AuditEvent.seq > last)))
        if not chunk:
            break
        for row in chunk:
            if row.seq < expected:
                return bad(
                    row.seq, f"row {row.seq} is before the chain's first row (added outside the audit writer)"
                )
            if row.seq != expected:
                gap = f"{expected}" if row.seq == expected + 1 else f"{expected}..{row.seq - 1}"
                return bad(expected, f"row {gap} is missing (deleted or renumbered)")
            if row.prev_hash != prev_hash:
                return bad(row.seq, "prev_hash does not match the previous row (moved or replaced)")
            try:
                edited = record_hash(stored_record(row)) != row.row_hash
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
        return bad(expected - 1, f"{HEAD_MISSING} (deleted)")
    if head.seq > expected - 1:
        return bad(expected, f"rows {expected}..{head.seq} are missing (the log was truncated)")
    if head.seq < expected - 1:
        return bad(head.seq + 1, "rows after the recorded head were added outside the audit writer")
    if head.row_hash != prev_hash:
        return bad(head.seq, "the last row does not match the recorded chain head")
    if anchor is not None and not anchor_seen:
        return bad(anchor[0], "the anchor row is beyond the end of the log")
    return VerifyReport(ok=True, rows=rows, head_seq=expected - 1, head_hash=prev_hash)
