"""The master key and AES-256-GCM sealing of key secrets at rest.

Each secret is sealed with a fresh 96-bit nonce and the key id as associated data, so a
ciphertext copied onto another key's row does not decrypt. A known constant sealed the same way
is the registry's *check value* (`seal_check`/`opens_check`, see `wmark.keys.master_check`): it
tells whether a master key is the one the registry's secrets are sealed under, without a secret.

A master key of one repeated byte (all zero), a short repeated pattern or a counting sequence is
refused at load: it is what a placeholder or a test value decodes to, not a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wmark.errors import MasterKeyError
from wmark.keys.config import RegistryConfig

__all__ = ["GENERATE_HINT", "MasterKey"]

_NONCE_BYTES = 12
_PLACEHOLDERS = {"changethis", "changeme", "secret", ""}
_CHECK_PLAINTEXT = b"wmark master-key check v1"
_CHECK_ASSOCIATED = b"wmark.master-key-check"
_MIN_DISTINCT_BYTES = 8  # a random 32-byte key has fewer with probability < 1e-36
GENERATE_HINT = "generate one with `wmark keys master-key`"


class MasterKey:
    """A 256-bit key that seals key secrets; `key_id` names it without revealing it."""

    __slots__ = ("_aead", "key_id")

    def __init__(self, raw: bytes) -> None:
        if len(raw) != 32:
            raise MasterKeyError("the master key must be 32 bytes")
        weakness = _weakness(raw)
        if weakness is not None:
            raise MasterKeyError(f"the master key is {weakness}, not a random key: {GENERATE_HINT}")
        self._aead = AESGCM(raw)
        self.key_id = hashlib.sha256(b"wmark.master-id.v1" + raw).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"MasterKey(id={self.key_id})"

    @classmethod
    def load(cls, config: RegistryConfig) -> MasterKey:
        """From `WMARK_MASTER_KEY` if set, else the 0600 key file (created on first use)."""
        if config.master_key is not None:
            return cls(_parse(config.master_key))
        return cls(_read_or_create(config.key_file))

    @staticmethod
    def generate() -> str:
        """A new master key, base64-encoded, for `WMARK_MASTER_KEY`."""
        return base64.b64encode(os.urandom(32)).decode("ascii")

    def seal(self, plaintext: bytes, associated: bytes) -> bytes:
        """nonce || AES-256-GCM(plaintext) bound to `associated`."""
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, associated)

    def open(self, blob: bytes, associated: bytes) -> bytes:
        """Inverse of `seal`; raises MasterKeyError on a wrong key or a tampered blob."""
        try:
            return self._aead.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], associated)
        except InvalidTag as exc:
            raise MasterKeyError("cannot decrypt a key secret: wrong master key or tampered row") from exc

    def seal_check(self) -> bytes:
        """The check value of this master key (a constant sealed under it)."""
        return self.seal(_CHECK_PLAINTEXT, _CHECK_ASSOCIATED)

    def opens_check(self, check_value: bytes) -> bool:
        """Whether `check_value` was sealed under this master key."""
        try:
            return self.open(check_value, _CHECK_ASSOCIATED) == _CHECK_PLAINTEXT
        except MasterKeyError:
            return False


def _weakness(raw: bytes) -> str | None:
    """What makes `raw` trivially guessable, or None."""
    if len(set(raw)) == 1:
        return "one byte repeated"
    if len(set(raw)) < _MIN_DISTINCT_BYTES:
        return f"made of only {len(set(raw))} distinct byte values"
    if len({(b - a) % 256 for a, b in zip(raw, raw[1:], strict=False)}) == 1:
        return "a counting sequence"
    return None


def _parse(value: str) -> bytes:
    value = value.strip()
    if value.lower() in _PLACEHOLDERS:
        raise MasterKeyError(f"WMARK_MASTER_KEY is a placeholder; {GENERATE_HINT}")
    if len(value) == 64:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    try:
        urlsafe = value.replace("+", "-").replace("/", "_")
        raw = base64.urlsafe_b64decode(urlsafe + "=" * (-len(urlsafe) % 4))
    except (binascii.Error, ValueError) as exc:
        raise MasterKeyError("WMARK_MASTER_KEY must be 32 bytes as base64 or 64 hex characters") from exc
    if len(raw) != 32:
        raise MasterKeyError(f"WMARK_MASTER_KEY decodes to {len(raw)} bytes; it must be 32")
    return raw


def _read_or_create(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise MasterKeyError(
                f"{path} is readable by others (mode {mode:o}); run: chmod 600 {path}"
            ) from None
        return _parse(path.read_text(encoding="ascii"))
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(MasterKey.generate() + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return _parse(path.read_text(encoding="ascii"))
