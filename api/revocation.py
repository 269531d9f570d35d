"""Whether a generation may go on: its token and its key, as the database has them now.

A generation outlives its request's admission: it waits in the queue, then runs block after
block. So the worker asks again when the job starts, before every block and in the transaction
of the audit row (`AuditLog.append(precondition=...)`, under the lock that revocations take),
and nothing is generated, audited or answered past a revocation, in whatever process it was
made (the CLI, another worker). The registry keeps no change counter a process could poll
instead, so the check between blocks reads the two rows themselves, by primary key, in one
statement on an autocommit connection: one round trip, a tenth of what a session's transaction
costs (BENCHMARKS.md, "Revocation checks"), and little next to a block's forwards. The check in
the audit transaction is `TokenStore.ensure_unrevoked`, as the detection routes' audit rows use it.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from wmark.errors import KeyRevokedError
from wmark.keys import KeyRegistry
from wmark.keys.models import ApiToken, Key
from wmark.keys.tokens import TokenRejected, TokenStore

__all__ = ["TokenRevoked", "check", "ensure_allowed"]

# (1 if the token is there and unrevoked else 0, the key's status or None): one round trip
_STATE = select(
    select(func.count())
    .select_from(ApiToken)
    .where(ApiToken.id == bindparam("token_id"), ApiToken.revoked_at.is_(None))
    .scalar_subquery(),
    select(Key.status).where(Key.id == bindparam("key_id")).scalar_subquery(),
)


class TokenRevoked(TokenRejected):
    """The token that asked for a generation was revoked before it ended."""

    code = "token_revoked"

    def __init__(self, token_id: str) -> None:
        super().__init__("revoked", token_id)
        self.args = ("this API token was revoked: its generation was stopped",)


def ensure_allowed(session: Session, token_id: str, key_id: str) -> None:
    """In the audit row's transaction: raise `TokenRevoked` or `KeyRevokedError` if the token or
    the key is revoked (or gone)."""
    try:
        TokenStore.ensure_unrevoked(session, token_id)
    except TokenRejected:
        raise TokenRevoked(token_id) from None
    status = session.execute(select(Key.status).where(Key.id == key_id)).scalar_one_or_none()
    _ensure_key(key_id, status)


def check(registry: KeyRegistry, token_id: str, key_id: str) -> str:
    """Raise as `ensure_allowed` does, from one statement of its own; else the key's status
    ("active", or "retired" once rotated)."""
    with registry.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        unrevoked, status = conn.execute(_STATE, {"token_id": token_id, "key_id": key_id}).one()
    if not unrevoked:
        raise TokenRevoked(token_id)
    return _ensure_key(key_id, status)


def _ensure_key(key_id: str, status: str | None) -> str:
    if status is None or status == "revoked":
        raise KeyRevokedError(f"key {key_id} was revoked: the generation under it was stopped")
    return status
