"""The key registry: create, list, rotate and revoke keys; hand decrypted keys to keyed code.

Secrets are generated here, sealed under the master key before they touch the database, and
leave only as `KeyMaterial` (whose `Secret` is redacted in any repr). `KeyInfo` is the public
view: everything but the secret. Every key change is written to the audit log in the same
transaction as the change; the registry also hands out the database's `AuditLog`, `TokenStore`,
`ReceiptKeyStore` (the signing keys of detection receipts) and `CalibrationStore` (the keys'
false-positive rates measured by `wmark calibrate`).

No secret is sealed under a master key that is not the registry's (`wmark.keys.master_check`),
and detection leaves out, with an error per key, a key that the master key cannot open (one
sealed under another master key before that check existed) instead of failing for every key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from tokenizers import Tokenizer as TokenizersTokenizer

from wmark.errors import (
    InputError,
    KeyNotFoundError,
    KeyRegistryError,
    KeyRevokedError,
    MasterKeyError,
    TokenizerError,
)
from wmark.keymaterial import KeyMaterial, KeyStatus
from wmark.keys.audit import AuditEntry
from wmark.keys.audit_log import AuditLog
from wmark.keys.calibrations import CalibrationStore
from wmark.keys.config import RegistryConfig
from wmark.keys.crypto import MasterKey
from wmark.keys.db import make_engine, make_sessionmaker, upgrade
from wmark.keys.master_check import (
    KeyUnavailableError,
    MasterKeyHealth,
    WrongMasterKeyError,
    ensure_master_key,
)
from wmark.keys.models import Key, Tokenizer, utcnow
from wmark.keys.receipt_keys import ReceiptKeyStore
from wmark.keys.tokens import TokenStore
from wmark.keys.transactions import write_transaction
from wmark.secret import Secret
from wmark.spec import TokenizerRef, WatermarkSpec
from wmark.vllm_gumbel import VllmWatermarkConfig

__all__ = ["KeyInfo", "KeyRegistry", "SkippedKey", "TokenizerNotFoundError", "no_usable_key"]

log = logging.getLogger("wmark.keys")


class TokenizerNotFoundError(TokenizerError):
    """No tokenizer with this SHA-256 is stored in the registry (the service answers 404)."""

    code = "tokenizer_not_found"
    status = 404


SECRET_BYTES = 32
_MAX_NAME = 200
LOCAL_ACTOR = "local"  # actor of key changes made without saying who (library calls)


def new_secret() -> Secret:
    """A fresh 256-bit key secret from the OS's CSPRNG (tests replace this to seed their keys)."""
    return Secret(os.urandom(SECRET_BYTES))


@dataclass(frozen=True, kw_only=True)
class KeyInfo:
    """Public view of a key (no secret, ever)."""

    key_id: str
    name: str
    status: KeyStatus
    fingerprint: str
    spec: WatermarkSpec
    created_at: datetime
    rotated_at: datetime | None
    revoked_at: datetime | None
    replaces: str | None
    replaced_by: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "key_id": self.key_id,
            "name": self.name,
            "status": self.status,
            "fingerprint": self.fingerprint,
            "spec": self.spec.to_dict(),
            "created_at": self.created_at.isoformat(),
            "rotated_at": self.rotated_at.isoformat() if self.rotated_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "replaces": self.replaces,
            "replaced_by": self.replaced_by,
        }


@dataclass(frozen=True)
class SkippedKey:
    """A detection key left out because the master key cannot open its secret, and why."""

    key_id: str
    message: str
    code: str = KeyUnavailableError.code

    def to_dict(self) -> dict[str, str]:
        """JSON-ready dict (the per-key error of a detection answer)."""
        return {"key_id": self.key_id, "code": self.code, "message": self.message}


def no_usable_key(skipped: Sequence[SkippedKey], *, requested: bool) -> MasterKeyError:
    """The error when every key to detect with was left out: the requested keys are unavailable
    (409), or, for every key of the registry, the master key is not the registry's (503)."""
    reasons = "; ".join(s.message for s in skipped)
    if requested:
        return KeyUnavailableError(reasons)
    return WrongMasterKeyError(f"the master key opens none of the registry's detection keys: {reasons}")


def _info(row: Key) -> KeyInfo:
    return KeyInfo(
        key_id=row.id,
        name=row.name,
        status=row.status,  # type: ignore[arg-type]  # constrained by the registry's writes
        fingerprint=row.fingerprint,
        spec=WatermarkSpec.from_json(row.spec),
        created_at=row.created_at,
        rotated_at=row.rotated_at,
        revoked_at=row.revoked_at,
        replaces=row.replaces,
        replaced_by=row.replaced_by,
    )


class KeyRegistry:
    """Keys and tokenizers in SQL.

    Args:
        engine: a migrated database engine.
        master_key: the key that seals secrets.
    """

    def __init__(self, engine: Engine, master_key: MasterKey) -> None:
        self.engine = engine
        self.master_key = master_key
        self.sessions: sessionmaker[Session] = make_sessionmaker(engine)
        self.audit = AuditLog(self.sessions)
        self.tokens = TokenStore(self.sessions)
        self.receipt_keys = ReceiptKeyStore(self.sessions, master_key)
        self.calibrations = CalibrationStore(self.sessions)
        self.master_key_health = MasterKeyHealth(self.sessions, master_key)

    @classmethod
    def open(cls, config: RegistryConfig | None = None, *, migrate: bool = True) -> KeyRegistry:
        """Open (and by default migrate) the registry that `config` points at.

        Without `config`, the one the environment configures (`RegistryConfig.from_env`:
        WMARK_HOME, WMARK_DATABASE_URL, WMARK_MASTER_KEY), as the CLI and the service use it.
        """
        config = RegistryConfig.from_env() if config is None else config
        master_key = MasterKey.load(config)
        engine = make_engine(config.database_url, config.timeouts)
        try:
            if migrate:
                upgrade(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, master_key)

    def close(self) -> None:
        """Release database connections."""
        self.engine.dispose()

    def __enter__(self) -> KeyRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KeyRegistry({self.engine.url.render_as_string(hide_password=True)})"

    # tokenizers -----------------------------------------------------------------------------

    def add_tokenizer(self, json_bytes: bytes, name: str) -> TokenizerRef:
        """Store a tokenizer.json (idempotent by content hash) and return its reference."""
        try:
            vocab_size = TokenizersTokenizer.from_str(json_bytes.decode("utf-8")).get_vocab_size(
                with_added_tokens=True
            )
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise TokenizerError(f"not a usable tokenizer.json: {exc}") from exc
        ref = TokenizerRef(
            name=name[:_MAX_NAME], sha256=hashlib.sha256(json_bytes).hexdigest(), vocab_size=vocab_size
        )
        with self.sessions.begin() as session:
            stored = session.get(Tokenizer, ref.sha256)
            if stored is None:
                session.add(
                    Tokenizer(
                        sha256=ref.sha256,
                        name=ref.name,
                        vocab_size=ref.vocab_size,
                        content=zlib.compress(json_bytes, 6),
                        created_at=utcnow(),
                    )
                )
            else:  # keep the name it was first stored under
                ref = TokenizerRef(name=stored.name, sha256=stored.sha256, vocab_size=stored.vocab_size)
        return ref

    def tokenizer_ref(self, sha256: str) -> TokenizerRef:
        """The reference of a stored tokenizer (what `add_tokenizer` returned for it)."""
        with self.sessions() as session:
            row = session.get(Tokenizer, sha256)
            if row is None:
                raise TokenizerNotFoundError(f"tokenizer {sha256[:12]} is not in the registry")
            return TokenizerRef(name=row.name, sha256=row.sha256, vocab_size=row.vocab_size)

    def tokenizer_json(self, sha256: str) -> bytes:
        """The stored tokenizer.json with this SHA-256."""
        with self.sessions() as session:
            row = session.get(Tokenizer, sha256)
            if row is None:
                raise TokenizerError(f"tokenizer {sha256[:12]} is not in the registry")
            return zlib.decompress(row.content)

    # keys -----------------------------------------------------------------------------------

    def create_key(
        self,
        name: str,
        tokenizer: TokenizerRef,
        *,
        context_width: int = 4,
        context_mode: str = "window",
        min_scored_tokens: int = 16,
        actor: str = LOCAL_ACTOR,
    ) -> KeyInfo:
        """Create an active key with a fresh random secret bound to `tokenizer` (audited as `actor`)."""
        name = _check_name(name)
        spec = WatermarkSpec(
            tokenizer=tokenizer,
            context_width=context_width,
            context_mode=context_mode,  # type: ignore[arg-type]  # validated by WatermarkSpec
            min_scored_tokens=min_scored_tokens,
        )
        with write_transaction(self.sessions) as session:
            if session.get(Tokenizer, tokenizer.sha256) is None:
                raise TokenizerError("add the tokenizer to the registry before creating a key with it")
            row = self._new_key(session, name, spec)
            _audit_key_change(session, actor, "key_create", [row])
            return _info(row)

    def import_vllm_key(
        self,
        name: str,
        tokenizer: TokenizerRef,
        config: VllmWatermarkConfig,
        *,
        min_scored_tokens: int = 16,
        actor: str = LOCAL_ACTOR,
    ) -> KeyInfo:
        """Register the key of a vLLM deployment's `--watermark-config`, to detect its watermark.

        The config's secret key is sealed under the master key like any secret; the rest goes
        in the public spec. Audited as a key creation.
        """
        name = _check_name(name)
        spec = config.spec(tokenizer, min_scored_tokens=min_scored_tokens)
        with write_transaction(self.sessions) as session:
            if session.get(Tokenizer, tokenizer.sha256) is None:
                raise TokenizerError("add the tokenizer to the registry before creating a key with it")
            row = self._new_key(session, name, spec, config.secret())
            _audit_key_change(session, actor, "key_create", [row])
            return _info(row)

    def _new_key(self, session: Session, name: str, spec: WatermarkSpec, secret: Secret | None = None) -> Key:
        ensure_master_key(session, self.master_key)
        key_id = "wk_" + secrets.token_hex(6)
        secret = secret if secret is not None else new_secret()
        row = Key(
            id=key_id,
            name=name,
            status="active",
            spec=spec.to_json(),
            fingerprint=secret.fingerprint(),
            tokenizer_sha256=spec.tokenizer.sha256,
            secret_ciphertext=self.master_key.seal(secret.reveal(), key_id.encode()),
            master_key_id=self.master_key.key_id,
            created_at=utcnow(),
        )
        session.add(row)
        session.flush()
        return row

    def list_keys(self, status: KeyStatus | None = None) -> list[KeyInfo]:
        """Keys, oldest first, optionally of one status."""
        with self.sessions() as session:
            query = select(Key).order_by(Key.created_at, Key.id)
            if status is not None:
                query = query.where(Key.status == status)
            return [_info(row) for row in session.scalars(query)]

    def get(self, key_id: str) -> KeyInfo:
        """One key's public view."""
        with self.sessions() as session:
            return _info(self._row(session, key_id))

    def key_state(self, session: Session | None = None) -> tuple[tuple[str, str], ...]:
        """(key_id, status) of every key: changes whenever the set of detection keys does.

        Args:
            session: read in this session (e.g. a write transaction, where key changes, which
                take the same lock, cannot interleave); default a session of its own.
        """
        query = select(Key.id, Key.status).order_by(Key.id)
        if session is not None:
            return tuple((r.id, r.status) for r in session.execute(query))
        with self.sessions() as own:
            return tuple((r.id, r.status) for r in own.execute(query))

    def rotate(self, key_id: str, *, actor: str = LOCAL_ACTOR) -> KeyInfo:
        """Create a successor with the same name and spec; the old key is retired (detect only)."""
        with write_transaction(self.sessions) as session:
            old = self._row(session, key_id, for_update=True)
            if old.status != "active":
                raise KeyRevokedError(f"key {key_id} is {old.status}; only an active key can be rotated")
            if WatermarkSpec.from_json(old.spec).is_vllm:
                raise InputError(
                    f"key {key_id} is a vLLM deployment's key: change it in vLLM's --watermark-config, "
                    "register the new one with `wmark keys create --scheme`, then revoke this one"
                )
            new = self._new_key(session, old.name, WatermarkSpec.from_json(old.spec))
            new.replaces = old.id
            old.status = "retired"
            old.rotated_at = utcnow()
            old.replaced_by = new.id
            _audit_key_change(session, actor, "key_rotate", [old, new])
            return _info(new)

    def revoke(self, key_id: str, *, actor: str = LOCAL_ACTOR) -> KeyInfo:
        """Revoke a key: it no longer generates nor detects. Idempotent (audited the first time)."""
        with write_transaction(self.sessions) as session:
            row = self._row(session, key_id, for_update=True)
            if row.status != "revoked":
                row.status = "revoked"
                row.revoked_at = utcnow()
                _audit_key_change(session, actor, "key_revoke", [row])
            return _info(row)

    def material(self, key_id: str, *, for_generation: bool = False) -> KeyMaterial:
        """The decrypted key. Revoked keys are refused; retired keys only detect."""
        with self.sessions() as session:
            row = self._detectable(session, key_id)
            if for_generation and WatermarkSpec.from_json(row.spec).is_vllm:
                raise InputError(
                    f"key {key_id} holds vLLM's native watermark: vLLM generates it, wmark detects it"
                )
            if for_generation and row.status != "active":
                raise KeyRevokedError(
                    f"key {key_id} is retired (rotated to {row.replaced_by}); generate with that one"
                )
            return self._unseal(row)

    def generation_key(self, key_id: str | None = None) -> KeyMaterial:
        """The key to generate with: `key_id`, or else the only active key wmark generates with
        (keys of vLLM's schemes are detected, never generated with, so they are no candidates).

        Raises:
            KeyRegistryError: no key given and none or several are active.
            KeyRevokedError: the key is revoked or retired.
        """
        if key_id is not None:
            return self.material(key_id, for_generation=True)
        active = [k for k in self.list_keys("active") if not k.spec.is_vllm]
        if not active:
            raise KeyRegistryError("no active key to generate with: create one with `wmark keys create NAME`")
        if len(active) > 1:
            ids = ", ".join(k.key_id for k in active)
            raise KeyRegistryError(f"several active keys ({ids}): choose one with --key")
        return self.material(active[0].key_id, for_generation=True)

    def detection_keys(self, key_ids: Sequence[str] | None = None) -> list[KeyMaterial]:
        """Keys to detect with: the given ones, or every active and retired key; a key the master
        key cannot open is left out with a warning in the log (`open_detection_keys` returns them).

        Raises:
            KeyUnavailableError, WrongMasterKeyError: every key was left out (`no_usable_key`).
        """
        keys, skipped = self.open_detection_keys(key_ids)
        if skipped and not keys:
            raise no_usable_key(skipped, requested=bool(key_ids))
        for key in skipped:
            log.warning("key %s left out of detection: %s", key.key_id, key.message)
        return keys

    def open_detection_keys(
        self, key_ids: Sequence[str] | None = None
    ) -> tuple[list[KeyMaterial], list[SkippedKey]]:
        """Keys to detect with (the given ones, or every active and retired key), and the keys
        left out because the master key cannot open them, each with its error.

        Raises:
            KeyNotFoundError, KeyRevokedError: a given key is unknown or revoked.
        """
        keys: list[KeyMaterial] = []
        skipped: list[SkippedKey] = []
        with self.sessions() as session:
            if key_ids:
                rows = [self._detectable(session, k) for k in dict.fromkeys(key_ids)]
            else:
                query = select(Key).where(Key.status != "revoked").order_by(Key.created_at, Key.id)
                rows = list(session.scalars(query))
            for row in rows:
                try:
                    keys.append(self._unseal(row))
                except KeyUnavailableError as exc:
                    skipped.append(SkippedKey(row.id, str(exc)))
        return keys, skipped

    def _detectable(self, session: Session, key_id: str) -> Key:
        row = self._row(session, key_id)
        if row.status == "revoked":
            raise KeyRevokedError(f"key {key_id} is revoked")
        return row

    def _unseal(self, row: Key) -> KeyMaterial:
        if row.master_key_id != self.master_key.key_id:
            raise KeyUnavailableError(
                f"key {row.id} was sealed under master key {row.master_key_id}, "
                f"but the configured master key is {self.master_key.key_id}"
            )
        try:
            secret = Secret(self.master_key.open(row.secret_ciphertext, row.id.encode()))
        except MasterKeyError as exc:
            raise KeyUnavailableError(f"key {row.id}: {exc}") from exc
        status: KeyStatus = "active" if row.status == "active" else "retired"
        return KeyMaterial(
            key_id=row.id, secret=secret, spec=WatermarkSpec.from_json(row.spec), status=status
        )

    @staticmethod
    def _row(session: Session, key_id: str, *, for_update: bool = False) -> Key:
        query = select(Key).where(Key.id == key_id)
        if for_update:
            query = query.with_for_update()
        row = session.scalars(query).first()
        if row is None:
            raise KeyNotFoundError(f"no key with id {key_id!r} (see `wmark keys list`)")
        return row


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > _MAX_NAME or not name.isprintable():
        raise InputError(f"a key name must be 1..{_MAX_NAME} printable characters")
    return name


def _audit_key_change(session: Session, actor: str, action: str, rows: Sequence[Key]) -> None:
    session.flush()
    result = {"keys": [{"key_id": r.id, "status": r.status, "fingerprint": r.fingerprint} for r in rows]}
    AuditLog.append_in(
        session, [AuditEntry(actor=actor, action=action, key_ids=tuple(r.id for r in rows), result=result)]
    )
