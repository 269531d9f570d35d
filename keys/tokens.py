"""API tokens of the detection service: random, shown once, stored as SHA-256, checked in constant time.

A token reads `wmt_<id>_<secret>`: the id (12 hex digits) finds the row, the 256-bit secret
proves possession. Only SHA-256 of the whole token is stored, so the database cannot give a
token back. Roles: `detector` (detect), `auditor` (read the audit log and metrics), `generator`
(watermarked generation, when the service serves it) and `admin` (keys, and everything the
others may do). Creating and revoking a token is audited.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from wmark.errors import AuthError, InputError, WmarkError
from wmark.keys.audit import AuditEntry
from wmark.keys.audit_log import AuditLog
from wmark.keys.models import ApiToken, utcnow
from wmark.keys.transactions import write_transaction

__all__ = ["ROLES", "IssuedToken", "Role", "TokenInfo", "TokenNotFoundError", "TokenStore", "TokenRejected"]

Role = Literal["admin", "detector", "auditor", "generator"]
ROLES: tuple[Role, ...] = get_args(Role)
PREFIX = "wmt"
_TOKEN = re.compile(r"^wmt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_MAX_NAME = 200
# Compared against when the id is unknown, so unknown and wrong tokens take the same time.
_DUMMY_HASH = hashlib.sha256(b"wmark.no-such-token").hexdigest()
_UNREVOKED = "wmark.tokens.unrevoked"  # session.info: token ids checked in this transaction


class TokenRejected(AuthError):
    """A bearer token was missing, malformed, unknown, revoked or wrong.

    Attributes:
        reason: "missing", "malformed", "unknown", "revoked", "mismatch" or "ambiguous" (more
            than one credential in the request; for the audit log;
            the client only ever sees "invalid or missing token").
        token_id: the id part of the token when it parsed.
    """

    def __init__(self, reason: str, token_id: str | None = None) -> None:
        super().__init__("invalid or missing API token")
        self.reason = reason
        self.token_id = token_id


class TokenNotFoundError(WmarkError):
    """No API token has this id."""

    code = "token_not_found"
    status = 404


@dataclass(frozen=True, kw_only=True)
class TokenInfo:
    """Public view of a token (never the token or its hash)."""

    token_id: str
    name: str
    role: Role
    created_at: datetime
    created_by: str
    revoked_at: datetime | None

    @property
    def actor(self) -> str:
        """How this token appears in the audit log."""
        return f"token:{self.token_id}"

    def allows(self, role: Role) -> bool:
        """True if this token may act as `role` (admin may act as any role)."""
        return self.revoked_at is None and (self.role == role or self.role == "admin")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "token_id": self.token_id,
            "name": self.name,
            "role": self.role,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


@dataclass(frozen=True, kw_only=True)
class IssuedToken:
    """A newly created token: `token` is shown to the user once and never stored."""

    info: TokenInfo
    token: str

    def __repr__(self) -> str:
        return f"IssuedToken(info={self.info!r}, token=<redacted>)"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        token_id=row.id,
        name=row.name,
        role=row.role,  # type: ignore[arg-type]  # constrained by create()
        created_at=row.created_at,
        created_by=row.created_by,
        revoked_at=row.revoked_at,
    )


class TokenStore:
    """API tokens in the registry database.

    Args:
        sessions: session factory of a migrated registry database.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def create(self, role: str, name: str = "", *, actor: str) -> IssuedToken:
        """Create a token with `role`; the returned `token` is the only copy there will be."""
        if role not in ROLES:
            raise InputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        name = name.strip()
        if len(name) > _MAX_NAME or not name.isprintable():
            raise InputError(f"a token name must be at most {_MAX_NAME} printable characters")
        token_id = secrets.token_hex(6)
        token = f"{PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
        with write_transaction(self.sessions) as session:
            row = ApiToken(
                id=token_id,
                name=name or f"{role}-{token_id}",
                role=role,
                token_sha256=_hash(token),
                created_at=utcnow(),
                created_by=actor,
            )
            session.add(row)
            AuditLog.append_in(
                session,
                [AuditEntry(actor=actor, action="token_create", result={"token_id": token_id, "role": role})],
            )
            return IssuedToken(info=_info(row), token=token)

    def list(self) -> list[TokenInfo]:
        """Every token, oldest first (revoked ones included)."""
        with self.sessions() as session:
            rows = session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id))
            return [_info(row) for row in rows]

    def revoke(self, token_id: str, *, actor: str) -> TokenInfo:
        """Revoke a token (idempotent; audited the first time)."""
        with write_transaction(self.sessions) as session:
            row = session.get(ApiToken, token_id)
            if row is None:
                raise TokenNotFoundError(f"no API token with id {token_id!r} (see `wmark tokens list`)")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
                AuditLog.append_in(
                    session,
                    [AuditEntry(actor=actor, action="token_revoke", result={"token_id": token_id})],
                )
            return _info(row)

    @staticmethod
    def ensure_unrevoked(session: Session, token_id: str) -> None:
        """Within a transaction: raise `TokenRejected("revoked")` if the token was revoked (or deleted).

        For callers that authenticated a token earlier (from a cache) and must not act on it
        past its revocation: see `AuditLog.append(precondition=...)`.

        A token found unrevoked is remembered for the rest of the transaction (`session.info`):
        the concurrent requests that one group commit writes usually share a token, and a
        revocation, which takes the same write lock, cannot commit in between.
        """
        unrevoked: set[str] = session.info.setdefault(_UNREVOKED, set())
        if token_id in unrevoked:
            return
        row = session.execute(select(ApiToken.revoked_at).where(ApiToken.id == token_id)).one_or_none()
        if row is None or row.revoked_at is not None:
            raise TokenRejected("revoked", token_id)
        unrevoked.add(token_id)

    def authenticate(self, token: str | None) -> TokenInfo:
        """The token's info if `token` is a valid, unrevoked token.

        Raises:
            TokenRejected: with the reason (for the audit log) and the id when it parsed.
        """
        if not token:
            raise TokenRejected("missing")
        match = _TOKEN.match(token)
        if match is None:
            raise TokenRejected("malformed")
        token_id = match.group(1)
        with self.sessions() as session:
            row = session.get(ApiToken, token_id)
            stored = row.token_sha256 if row is not None else _DUMMY_HASH
            matches = hmac.compare_digest(stored, _hash(token))
            if row is None:
                raise TokenRejected("unknown", token_id)
            if not matches:
                raise TokenRejected("mismatch", token_id)
            if row.revoked_at is not None:
                raise TokenRejected("revoked", token_id)
            return _info(row)
