"""Calibration results kept with their key: what `wmark calibrate` measured on the user's text.

A key's p-values are exact in theory; a calibration checks them on the user's own unwatermarked
corpus (its false-positive rate at alpha, with a binomial interval, and more: see
`wmark.eval.calibrate`). Each run is one row (`KeyCalibration`), audited as "key_calibrate" in
the same transaction; the newest row is the key's calibration.

Detection warns about a key in two states (`states`): "uncalibrated" (never calibrated) and
"stale" (calibrated under another spec: the SHA-256 of the key's spec differs from the one
recorded, so the measurement was of other p-values).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import KeyNotFoundError
from wmark.keys.audit import AuditEntry
from wmark.keys.audit_log import AuditLog
from wmark.keys.models import Key, KeyCalibration, utcnow
from wmark.keys.transactions import write_transaction

__all__ = ["Calibration", "CalibrationState", "CalibrationStore", "spec_digest", "warning_line"]

CalibrationState = Literal["calibrated", "uncalibrated", "stale"]


def spec_digest(spec_json: str) -> str:
    """SHA-256 of a key's stored spec (its canonical JSON, `WatermarkSpec.to_json()`)."""
    return hashlib.sha256(spec_json.encode("utf-8")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One stored calibration of a key.

    Attributes:
        calibration_id: the row's id.
        key_id: the key.
        created_at: when it was stored.
        corpus_sha256: identifies the corpus (`wmark.eval.calibrate.corpus_digest`).
        spec_sha256: the key's spec when calibrated (`spec_digest`).
        alpha: the significance level measured at.
        n_scored: documents scored (the binomial's n).
        n_flagged: of those, documents with p <= alpha.
        report: the whole report (`CalibrationReport.to_dict()`).
        stale: whether the key's spec has changed since.
    """

    calibration_id: str
    key_id: str
    created_at: datetime
    corpus_sha256: str
    spec_sha256: str
    alpha: float
    n_scored: int
    n_flagged: int
    report: Mapping[str, Any]
    stale: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the summary fields, then the report."""
        return {
            "calibration_id": self.calibration_id,
            "created_at": self.created_at.isoformat(),
            "corpus_sha256": self.corpus_sha256,
            "spec_sha256": self.spec_sha256,
            "stale": self.stale,
            "alpha": self.alpha,
            "n_scored": self.n_scored,
            "n_flagged": self.n_flagged,
            "report": dict(self.report),
        }


def _calibration(row: KeyCalibration, key_spec_sha256: str) -> Calibration:
    return Calibration(
        calibration_id=row.id,
        key_id=row.key_id,
        created_at=row.created_at,
        corpus_sha256=row.corpus_sha256,
        spec_sha256=row.spec_sha256,
        alpha=row.alpha,
        n_scored=row.n_scored,
        n_flagged=row.n_flagged,
        report=json.loads(row.report),
        stale=row.spec_sha256 != key_spec_sha256,
    )


class CalibrationStore:
    """Calibrations of the registry's keys (`KeyRegistry.calibrations`)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def add(
        self,
        key_id: str,
        *,
        corpus_sha256: str,
        alpha: float,
        n_scored: int,
        n_flagged: int,
        report: Mapping[str, Any],
        actor: str,
    ) -> Calibration:
        """Store a calibration of `key_id` under its current spec, audited as `actor`.

        Raises:
            KeyNotFoundError: no such key.
        """
        with write_transaction(self.sessions) as session:
            key = session.get(Key, key_id)
            if key is None:
                raise KeyNotFoundError(f"no key with id {key_id!r} (see `wmark keys list`)")
            row = KeyCalibration(
                id="cal_" + secrets.token_hex(6),
                key_id=key_id,
                created_at=utcnow(),
                corpus_sha256=corpus_sha256,
                spec_sha256=spec_digest(key.spec),
                alpha=alpha,
                n_scored=n_scored,
                n_flagged=n_flagged,
                report=json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False),
            )
            session.add(row)
            session.flush()
            summary = {
                "calibration_id": row.id,
                "corpus_sha256": corpus_sha256,
                "alpha": alpha,
                "n_scored": n_scored,
                "n_flagged": n_flagged,
            }
            AuditLog.append_in(
                session, [AuditEntry(actor=actor, action="key_calibrate", key_ids=(key_id,), result=summary)]
            )
            return _calibration(row, row.spec_sha256)

    def latest(self, key_id: str) -> Calibration | None:
        """The key's newest calibration, None if it was never calibrated.

        Raises:
            KeyNotFoundError: no such key.
        """
        with self.sessions() as session:
            key = session.get(Key, key_id)
            if key is None:
                raise KeyNotFoundError(f"no key with id {key_id!r} (see `wmark keys list`)")
            row = session.scalars(
                select(KeyCalibration)
                .where(KeyCalibration.key_id == key_id)
                .order_by(KeyCalibration.created_at.desc(), KeyCalibration.id.desc())
                .limit(1)
            ).first()
            return None if row is None else _calibration(row, spec_digest(key.spec))

    def states(self, key_ids: Sequence[str]) -> dict[str, CalibrationState]:
        """Each known key's state among `key_ids` (unknown ids are left out): two queries, however
        many keys and calibrations."""
        wanted = sorted(set(key_ids))
        if not wanted:
            return {}
        with self.sessions() as session:
            specs = {
                row.id: row.spec
                for row in session.execute(select(Key.id, Key.spec).where(Key.id.in_(wanted)))
            }
            newest: dict[str, str] = {}
            rows = session.execute(
                select(KeyCalibration.key_id, KeyCalibration.spec_sha256)
                .where(KeyCalibration.key_id.in_(wanted))
                .order_by(KeyCalibration.created_at, KeyCalibration.id)
            )
            for row in rows:
                newest[row.key_id] = row.spec_sha256
        out: dict[str, CalibrationState] = {}
        for key_id, spec in specs.items():
            if key_id not in newest:
                out[key_id] = "uncalibrated"
            else:
                out[key_id] = "calibrated" if newest[key_id] == spec_digest(spec) else "stale"
        return out


def warning_line(states: Mapping[str, CalibrationState]) -> str | None:
    """One line naming the keys never calibrated or calibrated under another spec (None if no key
    is), for the CLI to print on stderr when it detects with them."""
    never = sorted(k for k, state in states.items() if state == "uncalibrated")
    stale = sorted(k for k, state in states.items() if state == "stale")
    parts = [
        f"{what}: {', '.join(ids)}"
        for what, ids in (("never calibrated", never), ("spec changed since its calibration", stale))
        if ids
    ]
    if not parts:
        return None
    return (
        f"{'; '.join(parts)}; their false-positive rate on your text is unmeasured "
        "(wmark calibrate --key KEY CORPUS)"
    )
