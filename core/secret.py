"""`Secret`: key bytes that never show up in a repr, a log line or a traceback's locals."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["Secret"]


class Secret:
    """Secret bytes. `repr`/`str` are redacted; only `reveal()` gives the bytes back.

    Keyed functions in `wmark.prf` call `reveal()`; nothing else should.
    """

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray) or len(value) < 16:
            raise ValueError("a secret must be at least 16 bytes")
        self._value = bytes(value)

    def reveal(self) -> bytes:
        """The raw bytes. Pass them straight into a keyed function, never into a log."""
        return self._value

    def fingerprint(self) -> str:
        """A short public identifier derived one-way from the secret (safe to show)."""
        return hmac.new(self._value, b"wmark.fingerprint.v1", hashlib.sha256).hexdigest()[:16]

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __reduce__(self) -> tuple[type[Secret], tuple[bytes]]:
        # Pickling is needed to ship keys to scan workers; it stays out of any text output.
        return (Secret, (self._value,))
