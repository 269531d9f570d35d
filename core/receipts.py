"""Detection receipts: a verdict signed with Ed25519, checkable by anyone with the public keys.

A receipt is the canonical JSON text of ``{"payload": P, "signature": S}``, where S is the
base64url (no padding) Ed25519 signature of canonical_json(P). P says what was tested (the
SHA-256 of the input), under which key (id, fingerprint, spec hash), with what outcome, when,
by whom (`issuer`, `kid`) and which audit row records it (`audit_seq`); docs/receipts.md lists
every field.

Canonical JSON (`canonical_json`) is RFC 8785 (JCS) for the values a receipt holds: objects
with ASCII keys in sorted order, arrays, strings, integers of at most 53 bits, true, false and
null; no whitespace; strings in UTF-8 with only `"`, `\\` and U+0000..U+001F escaped (`\\b`,
`\\t`, `\\n`, `\\f`, `\\r`, else `\\u00xx`). There are no floats: a real number is a string
holding its shortest round-trip decimal (Python's `repr`, e.g. "-57.39421348876053", "-inf").

A receipt verifies only as the exact bytes it was issued as (one trailing newline aside): a
file whose bytes differ anywhere, even in a way a JSON parser would not notice (spaces, an
escape, a base64 padding bit), fails. Pure: no registry, no database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from wmark.jwk import PublishedKey, b64url, b64url_decode, thumbprint

__all__ = [
    "RECEIPT_TYPE",
    "ReceiptSigner",
    "Verification",
    "canonical_json",
    "real",
    "text_sha256",
    "token_ids_sha256",
    "verify_receipt",
]

RECEIPT_TYPE = "wmark.detection-receipt"
VERSION = 1
_MAX_INT = 2**53 - 1
_ENVELOPE = frozenset({"payload", "signature"})
# (field, type) every payload has; the rest depends on the kind of detection
_REQUIRED: tuple[tuple[str, type], ...] = (
    ("v", int),
    ("type", str),
    ("kid", str),
    ("issuer", str),
    ("issued_at", str),
    ("audit_seq", int),
    ("input", dict),
    ("key", dict),
    ("detection", dict),
)


def _check(value: Any, where: str = "$") -> None:
    """TypeError unless `value` holds only what canonical JSON allows (see the module doc)."""
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if abs(value) > _MAX_INT:
            raise TypeError(f"{where}: integer beyond 53 bits")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not key.isascii():
                raise TypeError(f"{where}: object keys must be ASCII strings")
            _check(item, f"{where}.{key}")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]")
        return
    raise TypeError(f"{where}: {type(value).__name__} has no canonical JSON (a float? use real())")


def canonical_json(value: Any) -> bytes:
    """The one UTF-8 JSON text of `value` (sorted keys, no whitespace, no floats)."""
    _check(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def real(x: float) -> str:
    """A real number as a receipt holds it: the shortest decimal that reads back as `x`."""
    return repr(float(x))


def text_sha256(text: str | bytes) -> str:
    """SHA-256 hex of a text's UTF-8 bytes (what the audit log keeps too)."""
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def token_ids_sha256(token_ids: Sequence[int], prompt_ids: Sequence[int] | None = None) -> str:
    """SHA-256 hex of token IDs as comma-separated decimals; with a prompt, its IDs likewise,
    then "|", then the answer's (as the service's audit rows hash them)."""
    ids = ",".join(str(int(i)) for i in token_ids)
    if prompt_ids is not None:
        ids = ",".join(str(int(i)) for i in prompt_ids) + "|" + ids
    return hashlib.sha256(ids.encode("ascii")).hexdigest()


class ReceiptSigner:
    """Signs receipts with one Ed25519 key.

    Args:
        private_key: the signing key.
        issuer: who signs (the service's identity, e.g. its host name), as receipts name it.
    """

    def __init__(self, private_key: Ed25519PrivateKey, issuer: str) -> None:
        self._key = private_key
        self.issuer = issuer
        raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.kid = thumbprint(b64url(raw))

    def __repr__(self) -> str:
        return f"ReceiptSigner(kid={self.kid}, issuer={self.issuer!r})"

    def sign(self, claims: Mapping[str, Any], *, audit_seq: int, issued_at: datetime | None = None) -> str:
        """The receipt of `claims` (its "input", "key" and "detection" objects), as canonical JSON.

        Args:
            claims: what the receipt attests (`wmark.detector.receipt` builds them).
            audit_seq: the audit log row that records the detection.
            issued_at: the signing time (default now).
        """
        when = (issued_at or datetime.now(UTC)).astimezone(UTC)
        payload = {
            **claims,
            "v": VERSION,
            "type": RECEIPT_TYPE,
            "kid": self.kid,
            "issuer": self.issuer,
            "issued_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "audit_seq": audit_seq,
        }
        signature = self._key.sign(canonical_json(payload))
        return canonical_json({"payload": payload, "signature": b64url(signature)}).decode("utf-8")


@dataclass(frozen=True, kw_only=True)
class Verification:
    """What `verify_receipt` found.

    Attributes:
        ok: the receipt is intact, signed by a key of the set that is not revoked, and matches
            the input when one was given.
        reason: why not (empty when ok).
        payload: the receipt's payload once it parsed (also when the check failed later).
        key_status: the signing key's status in the set, once it was found there.
    """

    ok: bool
    reason: str = ""
    payload: dict[str, Any] | None = None
    key_status: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"ok": self.ok, "reason": self.reason, "key_status": self.key_status, "payload": self.payload}


def verify_receipt(
    data: bytes | str,
    keys: Mapping[str, PublishedKey],
    *,
    text: bytes | None = None,
    token_ids: Sequence[int] | None = None,
    prompt_ids: Sequence[int] | None = None,
) -> Verification:
    """Check a receipt against public keys (`wmark.jwk.read_jwks`) and, if given, the input.

    Args:
        data: the receipt as issued (canonical JSON; one trailing newline allowed).
        keys: the signing keys by kid.
        text: the text tested, as its UTF-8 bytes.
        token_ids, prompt_ids: or the token IDs tested (and their prompt's).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    try:
        receipt = json.loads(raw.decode("utf-8"))
        canonical = canonical_json(receipt)
    except (ValueError, RecursionError, TypeError):
        return Verification(ok=False, reason="not a receipt (canonical JSON of payload and signature)")
    if canonical != raw:
        return Verification(ok=False, reason="not in canonical form: a byte was changed, added or removed")
    if not isinstance(receipt, dict) or set(receipt) != _ENVELOPE or not isinstance(receipt["payload"], dict):
        return Verification(ok=False, reason='not a receipt: expected {"payload": {...}, "signature": "..."}')
    payload: dict[str, Any] = receipt["payload"]
    for name, kind in _REQUIRED:
        if not isinstance(payload.get(name), kind):
            return Verification(ok=False, reason=f"not a receipt: no {name} in its payload", payload=payload)
    if payload["type"] != RECEIPT_TYPE:
        return Verification(ok=False, reason=f"not a detection receipt: {payload['type']}", payload=payload)
    if payload["v"] != VERSION:
        return Verification(
            ok=False, reason=f"a receipt of version {payload['v']}: upgrade wmark", payload=payload
        )
    key = keys.get(payload["kid"])
    if key is None:
        return Verification(ok=False, reason=f"signed by an unknown key {payload['kid']}", payload=payload)
    try:
        key.key.verify(_signature(receipt["signature"]), canonical_json(payload))
    except (InvalidSignature, ValueError):
        reason = "the signature does not match: the receipt was changed"
    else:
        revoked = f", revoked at {key.revoked_at}" if key.revoked_at else ""
        reason = (
            f"signed by a revoked key ({key.kid}{revoked})"
            if key.status == "revoked"
            else _input_mismatch(payload["input"], text, token_ids, prompt_ids)
        )
    return Verification(ok=not reason, reason=reason, payload=payload, key_status=key.status)


def _signature(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("the signature is not a string")
    signature = b64url_decode(value)
    if len(signature) != 64:
        raise ValueError("an Ed25519 signature is 64 bytes")
    return signature


def _input_mismatch(
    claimed: Mapping[str, Any],
    text: bytes | None,
    token_ids: Sequence[int] | None,
    prompt_ids: Sequence[int] | None,
) -> str:
    """Why the input given is not the one the receipt attests ("" if it is, or none was given)."""
    if text is None and token_ids is None:
        return ""
    kind = claimed.get("kind")
    if text is not None:
        given, digest = "text", text_sha256(text)
    else:
        assert token_ids is not None
        given = "token_ids" if prompt_ids is None else "prompt_and_token_ids"
        digest = token_ids_sha256(token_ids, prompt_ids)
    if kind != given:
        return f"the receipt attests {kind} input, not {given}"
    if claimed.get("sha256") != digest:
        return (
            f"the input does not match the receipt: its SHA-256 is {digest}, "
            f"the receipt's {claimed.get('sha256')}"
        )
    return ""
