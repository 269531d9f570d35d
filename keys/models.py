"""ORM models of the registry (SQLAlchemy 2.0): tokenizers, keys, API tokens, the audit log, the
signing keys of detection receipts and the keys' calibrations.

Schema changes go through Alembic migrations (keys/migrations/versions).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ApiToken",
    "AuditEvent",
    "AuditHead",
    "Base",
    "Key",
    "KeyCalibration",
    "MasterKeyCheck",
    "ReceiptKey",
    "Tokenizer",
    "UTCDateTime",
    "utcnow",
]


def utcnow() -> datetime:
    """Timezone-aware now in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:  # noqa: ARG002
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: use wmark.keys.models.utcnow()")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:  # noqa: ARG002
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of all registry tables."""


class Tokenizer(Base):
    """A tokenizer.json, stored so that detection never needs model files."""

    __tablename__ = "tokenizers"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    vocab_size: Mapped[int] = mapped_column(Integer)
    content: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed tokenizer.json
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Key(Base):
    """A watermark key: public metadata, spec, and the secret sealed under the master key."""

    __tablename__ = "keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[str] = mapped_column(Text)  # WatermarkSpec.to_json()
    fingerprint: Mapped[str] = mapped_column(String(16))
    tokenizer_sha256: Mapped[str] = mapped_column(ForeignKey("tokenizers.sha256"))
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    rotated_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    replaces: Mapped[str | None] = mapped_column(String(32), nullable=True)
    replaced_by: Mapped[str | None] = mapped_column(String(32), nullable=True)


# SQLite only auto-assigns INTEGER PRIMARY KEY, PostgreSQL wants BIGINT for a log that keeps growing.
_BigInt = BigInteger().with_variant(Integer(), "sqlite")


class ApiToken(Base):
    """A bearer token of the service: only the SHA-256 of the token is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AuditEvent(Base):
    """One row of the hash-chained audit log (see wmark.keys.audit for the chain rule)."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(_BigInt, primary_key=True, autoincrement=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(32), index=True)
    key_ids: Mapped[str] = mapped_column(Text)  # canonical JSON list
    text_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    result: Mapped[str] = mapped_column(Text)  # canonical JSON object
    prev_hash: Mapped[str] = mapped_column(String(64))
    row_hash: Mapped[str] = mapped_column(String(64))


class AuditHead(Base):
    """The chain head (one row, id 1): writers lock it, and verify checks the log ends there."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(_BigInt)
    row_hash: Mapped[str] = mapped_column(String(64))


class ReceiptKey(Base):
    """An Ed25519 key that signs detection receipts (`wmark.keys.receipt_keys`): the private half
    sealed under the master key, the public half kept for good (receipts outlive their key)."""

    __tablename__ = "receipt_keys"

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)  # RFC 7638 thumbprint
    public_key: Mapped[str] = mapped_column(String(64))  # base64url of the 32 raw bytes
    private_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)  # active, retired or revoked
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class KeyCalibration(Base):
    """One run of `wmark calibrate` on a key (`wmark.keys.calibrations`): the false-positive rate
    measured on the user's own unwatermarked corpus; the newest row per key is the key's."""

    __tablename__ = "key_calibrations"
    __table_args__ = (Index("ix_key_calibrations_key_id", "key_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("keys.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    corpus_sha256: Mapped[str] = mapped_column(String(64))
    spec_sha256: Mapped[str] = mapped_column(String(64))  # of the key's spec when calibrated
    alpha: Mapped[float] = mapped_column(Float)
    n_scored: Mapped[int] = mapped_column(Integer)
    n_flagged: Mapped[int] = mapped_column(Integer)
    report: Mapped[str] = mapped_column(Text)  # canonical JSON: the whole calibration report


class MasterKeyCheck(Base):
    """The master-key check value (one row, id 1; `wmark.keys.master_check`): a constant sealed
    under the master key of the registry's secrets, empty until the first write sets it."""

    __tablename__ = "master_key_check"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    master_key_id: Mapped[str | None] = mapped_column(String(16), nullable=True)
    check_value: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    set_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
