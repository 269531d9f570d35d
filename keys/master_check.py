"""The registry's master-key check: no secret sealed under a master key that cannot open the
registry's, and a cheap answer to "does the master key open the active keys?".

A `WMARK_MASTER_KEY` set to another value opens none of the stored secrets, yet it could seal new
ones: a rotation under it retired the good key for one that the right master key cannot open.
So every write of a secret first checks the master key against the registry's *check value* (a
constant sealed under the registry's master key, one row of `master_key_check`) and is refused
with `WrongMasterKeyError` when it does not open it. The row is filled by the first write that
passes: in a new registry the first secret's, in one from before the check existed the first
write whose master key opens one of the secrets already stored (one that opens none is refused).
Errors name master keys by their id (a hash), never by their value.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import MasterKeyError
from wmark.keys.crypto import MasterKey
from wmark.keys.models import Key, MasterKeyCheck, utcnow

__all__ = ["KeyUnavailableError", "MasterKeyHealth", "WrongMasterKeyError", "ensure_master_key", "opens_key"]

_FIX = (
    "set WMARK_MASTER_KEY (or the master.key file in WMARK_HOME) to the master key the registry "
    "was created with"
)


class WrongMasterKeyError(MasterKeyError):
    """The configured master key is not the one the registry's secrets are sealed under: nothing
    is written with it (the service answers 503: it is misconfigured, not the request wrong)."""

    code = "wrong_master_key"
    status = 503


class KeyUnavailableError(MasterKeyError):
    """A key's secret cannot be opened under the configured master key (sealed under another)."""

    code = "key_unavailable"
    status = 409


def opens_key(master_key: MasterKey, row: Key) -> bool:
    """Whether `master_key` opens the secret of `row` (a hash comparison first, then AES-GCM)."""
    if row.master_key_id != master_key.key_id:
        return False
    try:
        master_key.open(row.secret_ciphertext, row.id.encode())
    except MasterKeyError:
        return False
    return True


def ensure_master_key(session: Session, master_key: MasterKey) -> None:
    """In a write transaction, before sealing a secret under `master_key`: refuse a master key
    that is not the registry's, or record it as the registry's if none is recorded yet.

    The check row is locked (FOR UPDATE), so concurrent first writers on PostgreSQL queue.

    Raises:
        WrongMasterKeyError: `master_key` does not open the check value, or (no check value
            yet) opens none of the stored key secrets.
    """
    row = session.scalars(select(MasterKeyCheck).where(MasterKeyCheck.id == 1).with_for_update()).first()
    if row is not None and row.check_value is not None:
        if master_key.opens_check(row.check_value):
            return
        raise WrongMasterKeyError(
            f"the configured master key (id {master_key.key_id}) is not this registry's (id "
            f"{row.master_key_id}): nothing was written; {_FIX}"
        )
    stored = session.scalars(select(Key).order_by(Key.created_at, Key.id)).all()
    if stored and not any(opens_key(master_key, key) for key in stored):
        sealed_under = ", ".join(sorted({key.master_key_id for key in stored}))
        raise WrongMasterKeyError(
            f"the configured master key (id {master_key.key_id}) opens none of the registry's "
            f"{len(stored)} key secrets (sealed under master key {sealed_under}): nothing was "
            f"written; {_FIX}"
        )
    if row is None:  # the migration inserts it; a row deleted by hand is recreated
        row = MasterKeyCheck(id=1)
        session.add(row)
    row.master_key_id = master_key.key_id
    row.check_value = master_key.seal_check()
    row.set_at = utcnow()
    session.flush()


class MasterKeyHealth:
    """Whether the master key opens the registry's active keys, for the service's readiness.

    A probe reads the check value and the active keys' ids (two small queries); the secrets are
    opened only when those changed since the last probe, so probes decrypt nothing in the steady
    state.
    """

    def __init__(self, sessions: sessionmaker[Session], master_key: MasterKey) -> None:
        self._sessions = sessions
        self._master_key = master_key
        self._lock = threading.Lock()
        self._seen: tuple[bytes | None, tuple[str, ...]] | None = None
        self._problem: str | None = None

    def problem(self) -> str | None:
        """Why the master key cannot serve the registry's active keys, or None when it can."""
        with self._sessions() as session:
            check = session.scalars(select(MasterKeyCheck.check_value).where(MasterKeyCheck.id == 1)).first()
            active = tuple(session.scalars(select(Key.id).where(Key.status == "active").order_by(Key.id)))
            with self._lock:
                if self._seen != (check, active):
                    self._problem = self._diagnose(session, check, active)
                    self._seen = (check, active)
                return self._problem

    def _diagnose(self, session: Session, check: bytes | None, active: Sequence[str]) -> str | None:
        if check is not None and not self._master_key.opens_check(check):
            return f"the master key (id {self._master_key.key_id}) is not this registry's"
        rows = session.scalars(select(Key).where(Key.id.in_(active)).order_by(Key.id)).all()
        closed = [row.id for row in rows if not opens_key(self._master_key, row)]
        if closed:
            return (
                f"the master key (id {self._master_key.key_id}) cannot open active key(s) "
                f"{', '.join(closed)}: revoke them, or configure the master key they were sealed under"
            )
        return None
