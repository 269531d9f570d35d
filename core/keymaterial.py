"""`KeyMaterial`: what a keyed function needs from a key (id, secret, spec), with no database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmark.secret import Secret
from wmark.spec import WatermarkSpec

__all__ = ["KeyMaterial", "KeyStatus"]

KeyStatus = Literal["active", "retired", "revoked"]


@dataclass(frozen=True, kw_only=True)
class KeyMaterial:
    """A decrypted key, handed from the registry to the generator or the detector.

    Attributes:
        key_id: public identifier.
        secret: the secret (redacted in every repr).
        spec: the watermark spec the key was created with.
        status: "active" (generates and detects) or "retired" (detects only).
    """

    key_id: str
    secret: Secret
    spec: WatermarkSpec
    status: KeyStatus = "active"
