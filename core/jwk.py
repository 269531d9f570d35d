"""Ed25519 public keys as JSON Web Keys, and the key sets that publish them (JWKS).

A key is an RFC 8037 JWK (`"kty": "OKP"`, `"crv": "Ed25519"`, `"x"`: the 32-byte public key,
base64url without padding); its `kid` is its RFC 7638 thumbprint, so anyone can recompute a
key's id from the key and a set cannot name a key falsely. The set also says what became of
each key: `"status"` is "active" (signs now), "retired" (rotated out: its receipts still
verify) or "revoked" (with `"revoked_at"`: its receipts no longer verify). JWK consumers that
do not know these members ignore them (RFC 7517 section 4).

Pure: `cryptography` and the standard library, no registry, so a receipt verifies offline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from wmark.errors import InputError

__all__ = ["KeyState", "PublishedKey", "b64url", "b64url_decode", "public_jwk", "read_jwks", "thumbprint"]

KeyState = Literal["active", "retired", "revoked"]
_STATES: frozenset[str] = frozenset({"active", "retired", "revoked"})


def b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Inverse of `b64url`, strict: only the one encoding `b64url` writes is accepted.

    A lenient decoder reads several strings as the same bytes (padding, the unused low bits of
    the last character), so a changed character could go unnoticed; here it cannot.
    """
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None
    if b64url(data) != text:
        raise ValueError("not the canonical base64url of its bytes")
    return data


def thumbprint(x: str) -> str:
    """RFC 7638 thumbprint of the Ed25519 JWK with public key `x`: SHA-256 of its required
    members in lexicographic order, no whitespace, base64url."""
    required = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, sort_keys=True, separators=(",", ":"))
    return b64url(hashlib.sha256(required.encode("ascii")).digest())


def public_jwk(raw: bytes) -> dict[str, str]:
    """The JWK of a raw 32-byte Ed25519 public key, `kid` its thumbprint."""
    x = b64url(raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": thumbprint(x), "alg": "EdDSA", "use": "sig"}


@dataclass(frozen=True, kw_only=True)
class PublishedKey:
    """A verification key as a key set publishes it.

    Attributes:
        kid: its thumbprint.
        key: the public key.
        status: "active", "retired" or "revoked".
        revoked_at: when it was revoked (RFC 3339), for a revoked key.
    """

    kid: str
    key: Ed25519PublicKey
    status: KeyState
    revoked_at: str | None = None


def read_jwks(data: bytes | str | Mapping[str, Any]) -> dict[str, PublishedKey]:
    """The Ed25519 keys of a JWKS document, by kid.

    Keys of other types are skipped (a set may hold them); an Ed25519 key must be well formed
    and its `kid` its thumbprint. A key without `"status"` counts as active.

    Raises:
        InputError: not a JWKS document, or a malformed Ed25519 key in it.
    """
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            raise InputError("the public keys are not JSON (a JWKS document)") from None
    keys = data.get("keys") if isinstance(data, Mapping) else None
    if not isinstance(keys, list):
        raise InputError('the public keys are not a JWKS document ({"keys": [...]})')
    found: dict[str, PublishedKey] = {}
    for jwk in keys:
        if not isinstance(jwk, Mapping) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        key = _published(jwk)
        found[key.kid] = key
    return found


def _published(jwk: Mapping[str, Any]) -> PublishedKey:
    x, kid = jwk.get("x"), jwk.get("kid")
    if not isinstance(x, str) or not isinstance(kid, str):
        raise InputError("an Ed25519 key of the set has no string x or kid")
    try:
        raw = b64url_decode(x)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise InputError(f"key {kid[:43]!r} of the set: x is not 32 bytes of base64url")
    if thumbprint(x) != kid:
        raise InputError(f"key {kid[:43]!r} of the set: its kid is not its RFC 7638 thumbprint")
    status = jwk.get("status", "active")
    revoked_at = jwk.get("revoked_at")
    if status not in _STATES or (revoked_at is not None and not isinstance(revoked_at, str)):
        raise InputError(f"key {kid} of the set: bad status or revoked_at")
    return PublishedKey(
        kid=kid,
        key=Ed25519PublicKey.from_public_bytes(raw),
        status=status,
        revoked_at=revoked_at,
    )
