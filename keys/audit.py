"""The audit log's rows: what is appended, how a row is serialised, and the hash chain.

Every detection, key change, token change and failed authentication is one row: time, actor,
action, key ids, the SHA-256 of the text (never the text) and a result object. Rows are chained:

    row_hash = SHA-256(prev_hash || canonical(row))

where canonical(row) is JSON with sorted keys, no spaces and ASCII escapes, so that one row has
exactly one serialisation. `wmark.keys.audit_log` appends rows under the database's write lock
(`wmark.keys.transactions`), so any number of processes append one linear chain;
`wmark.keys.audit_verify` replays the chain and names the first row that was edited, deleted or
moved. Someone who can rewrite the whole table and the head can rebuild a consistent chain:
record `verify`'s head hash outside the database and pass it back as an anchor.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from wmark.errors import KeyRegistryError
from wmark.keys.models import AuditEvent

__all__ = [
    "GENESIS",
    "HEAD_MISSING",
    "AuditEntry",
    "AuditLogCorrupt",
    "AuditRecord",
    "VerifyReport",
    "canonical_json",
    "canonical_row",
    "chain_hash",
    "detection_entry",
    "record_hash",
    "stored_record",
    "text_digest",
]

GENESIS = "0" * 64  # prev_hash of the first row
HEAD_MISSING = "the chain head (table audit_head) is missing"


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


def canonical_json(value: Any) -> str:
    """The one JSON text of `value`: sorted keys, no spaces, ASCII escapes (`_plain` first)."""
    return json.dumps(
        _plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """What a caller appends (the log adds seq, time and hashes).

    Attributes:
        actor: who did it ("token:<id>", "cli:<user>", "anonymous").
        action: what ("detect", "scan_start", "scan", "generate_start", "generate", "key_create",
            "key_rotate", "key_revoke", "key_calibrate", "receipt_key_create|rotate|revoke",
            "token_create", "token_revoke", "auth_failed").
        key_ids: keys involved.
        text_sha256: SHA-256 of the text detected, for detections; of the results file, for
            scans; of the output, for generations.
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
    return canonical_json(
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


def stored_record(row: AuditEvent) -> AuditRecord:
    """The record of a stored row, or `AuditLogCorrupt` naming the row and the bad column."""
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


def record_hash(record: AuditRecord) -> str:
    """The row hash `record` must carry: its canonical row chained to its `prev_hash`."""
    canonical = canonical_row(
        seq=record.seq,
        at=record.at,
        actor=record.actor,
        action=record.action,
        key_ids=record.key_ids,
        text_sha256=record.text_sha256,
        result=record.result,
    )
    return chain_hash(record.prev_hash, canonical)
