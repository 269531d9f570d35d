"""The Ed25519 keys that sign detection receipts: stored, rotated, revoked, published.

The private half of a key is sealed under the master key, as watermark secrets are
(`MasterKey.seal`, bound to the key's id); the public half stays in the clear for good, so a
receipt keeps verifying after its key is rotated out ("retired"). A revoked key is kept too,
and published as revoked: its receipts then fail verification, saying so (the key may have
leaked, and anyone holding it could sign any receipt, back-dated or not). At most one key is
active; the first receipt creates one. Every change is audited in the same transaction.

Key ids are RFC 7638 thumbprints (`wmark.jwk`); the public keys are published as a JWKS
document (`jwks`: `GET /v1/receipts/keys`, `wmark receipt keys --json`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import KeyNotFoundError, MasterKeyError
from wmark.jwk import KeyState, b64url_decode, public_jwk
from wmark.keys.audit import AuditEntry
from wmark.keys.audit_log import AuditLog
from wmark.keys.crypto import MasterKey
from wmark.keys.master_check import ensure_master_key
from wmark.keys.models import AuditHead, ReceiptKey, utcnow
from wmark.keys.transactions import write_transaction
from wmark.receipts import ReceiptSigner

__all__ = ["ISSUER_ENV", "ReceiptKeyInfo", "ReceiptKeyStore", "default_issuer"]

ISSUER_ENV = "WMARK_RECEIPT_ISSUER"


def default_issuer(env: Mapping[str, str] | None = None) -> str:
    """Who signs, as receipts name it: `WMARK_RECEIPT_ISSUER`, else "wmark@<host name>"."""
    env = os.environ if env is None else env
    return env.get(ISSUER_ENV, "").strip() or f"wmark@{socket.gethostname()}"


@dataclass(frozen=True, kw_only=True)
class ReceiptKeyInfo:
    """A signing key's public view (never its private half)."""

    kid: str
    public_key: str
    status: KeyState
    created_at: datetime
    retired_at: datetime | None
    revoked_at: datetime | None

    def to_jwk(self) -> dict[str, Any]:
        """The key as its JWKS entry: the RFC 8037 JWK, its status and its dates."""
        jwk: dict[str, Any] = public_jwk(b64url_decode(self.public_key))
        jwk["status"] = self.status
        jwk["created_at"] = _rfc3339(self.created_at)
        if self.retired_at is not None:
            jwk["retired_at"] = _rfc3339(self.retired_at)
        if self.revoked_at is not None:
            jwk["revoked_at"] = _rfc3339(self.revoked_at)
        return jwk


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _info(row: ReceiptKey) -> ReceiptKeyInfo:
    return ReceiptKeyInfo(
        kid=row.kid,
        public_key=row.public_key,
        status=row.status,  # type: ignore[arg-type]  # constrained by the store's writes
        created_at=row.created_at,
        retired_at=row.retired_at,
        revoked_at=row.revoked_at,
    )


def _associated(kid: str) -> bytes:
    """What a sealed private key is bound to: it opens only on its own row."""
    return b"wmark.receipt-key:" + kid.encode("ascii")


class ReceiptKeyStore:
    """The receipt signing keys of one registry database.

    Args:
        sessions: session factory of a migrated registry database.
        master_key: the key that seals the private halves.
    """

    def __init__(self, sessions: sessionmaker[Session], master_key: MasterKey) -> None:
        self.sessions = sessions
        self.master_key = master_key
        self._lock = threading.Lock()
        self._cached: tuple[str, Ed25519PrivateKey] | None = None

    def signer(self, issuer: str, *, actor: str) -> ReceiptSigner:
        """A signer with the active key, created (and audited as `actor`) if there is none.

        One indexed query per call finds the active key; its private half is unsealed only
        when it changed (rotation or revocation by another process is seen at the next call).
        """
        with self.sessions() as session:
            kid = session.scalars(select(ReceiptKey.kid).where(ReceiptKey.status == "active")).first()
        with self._lock:
            if kid is None or self._cached is None or self._cached[0] != kid:
                self._cached = self._active_key(actor) if kid is None else self._unseal(kid)
            return ReceiptSigner(self._cached[1], issuer)

    def _active_key(self, actor: str) -> tuple[str, Ed25519PrivateKey]:
        """The active key, created if there still is none once the write lock is held."""
        with write_transaction(self.sessions) as session:
            _lock_audit_head(session)
            row = session.scalars(select(ReceiptKey).where(ReceiptKey.status == "active")).first()
            if row is not None:
                return row.kid, self._open(row)
            row, key = self._new(session)
            _audit(session, actor, "receipt_key_create", [row])
            return row.kid, key

    def _unseal(self, kid: str) -> tuple[str, Ed25519PrivateKey]:
        with self.sessions() as session:
            return kid, self._open(self._row(session, kid))

    def _open(self, row: ReceiptKey) -> Ed25519PrivateKey:
        if row.master_key_id != self.master_key.key_id:
            raise MasterKeyError(
                f"receipt key {row.kid} was sealed under master key {row.master_key_id}, "
                f"but the configured master key is {self.master_key.key_id}"
            )
        raw = self.master_key.open(row.private_ciphertext, _associated(row.kid))
        return Ed25519PrivateKey.from_private_bytes(raw)

    def _new(self, session: Session) -> tuple[ReceiptKey, Ed25519PrivateKey]:
        ensure_master_key(session, self.master_key)  # never sealed under a master key not the registry's
        key = Ed25519PrivateKey.generate()
        jwk = public_jwk(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
        private = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        row = ReceiptKey(
            kid=jwk["kid"],
            public_key=jwk["x"],
            private_ciphertext=self.master_key.seal(private, _associated(jwk["kid"])),
            master_key_id=self.master_key.key_id,
            status="active",
            created_at=utcnow(),
        )
        session.add(row)
        session.flush()
        return row, key

    def rotate(self, *, actor: str) -> ReceiptKeyInfo:
        """A new active key; the active one (if any) is retired: its receipts still verify."""
        with write_transaction(self.sessions) as session:
            _lock_audit_head(session)
            old = list(session.scalars(select(ReceiptKey).where(ReceiptKey.status == "active")))
            for row in old:
                row.status = "retired"
                row.retired_at = utcnow()
            new, _ = self._new(session)
            _audit(session, actor, "receipt_key_rotate", [*old, new])
            return _info(new)

    def revoke(self, kid: str, *, actor: str) -> ReceiptKeyInfo:
        """Revoke a key: its receipts, old ones too, fail verification from now on (idempotent;
        audited the first time). The next receipt gets a new key if this one was active."""
        with write_transaction(self.sessions) as session:
            _lock_audit_head(session)
            row = self._row(session, kid)
            if row.status != "revoked":
                row.status = "revoked"
                row.revoked_at = utcnow()
                _audit(session, actor, "receipt_key_revoke", [row])
            return _info(row)

    def list(self) -> list[ReceiptKeyInfo]:
        """Every key, revoked ones too, oldest first."""
        with self.sessions() as session:
            query = select(ReceiptKey).order_by(ReceiptKey.created_at, ReceiptKey.kid)
            return [_info(row) for row in session.scalars(query)]

    def jwks(self) -> dict[str, Any]:
        """The public keys as a JWKS document, with each key's status (see `wmark.jwk`)."""
        return {"keys": [info.to_jwk() for info in self.list()]}

    @staticmethod
    def _row(session: Session, kid: str) -> ReceiptKey:
        row = session.get(ReceiptKey, kid, with_for_update=True)
        if row is None:
            raise KeyNotFoundError(f"no receipt signing key {kid!r} (see `wmark receipt keys`)")
        return row


def _lock_audit_head(session: Session) -> None:
    """Take the audit chain's lock first: key changes then queue behind every writer (on
    PostgreSQL too, where the write transaction takes no lock of its own), so two processes
    cannot both create the active key."""
    session.execute(select(AuditHead.seq).where(AuditHead.id == 1).with_for_update())


def _audit(session: Session, actor: str, action: str, rows: list[ReceiptKey]) -> None:
    session.flush()
    result = {"receipt_keys": [{"kid": r.kid, "status": r.status} for r in rows]}
    AuditLog.append_in(session, [AuditEntry(actor=actor, action=action, result=result)])
