"""What a detection receipt attests: the claims that `wmark.receipts.ReceiptSigner` signs.

One shape for `wmark detect --receipt`, the service's `receipt: true` and scan rows, so a
verifier reads them alike (docs/receipts.md). Real numbers are decimal strings
(`wmark.receipts.real`): a receipt holds no floats.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from wmark.detector.result import Detection
from wmark.errors import KeyNotFoundError
from wmark.keymaterial import KeyMaterial
from wmark.receipts import real

__all__ = ["detection_claims", "key_claims"]


def key_claims(keys: Sequence[KeyMaterial], key_id: str) -> dict[str, Any]:
    """The reported key as a receipt names it: id, fingerprint, spec hash and version."""
    key = next((k for k in keys if k.key_id == key_id), None)
    if key is None:
        raise KeyNotFoundError(f"key {key_id} was not among the keys tested")
    return {
        "id": key.key_id,
        "fingerprint": key.secret.fingerprint(),
        "spec_sha256": hashlib.sha256(key.spec.to_json().encode("utf-8")).hexdigest(),
        "spec_version": key.spec.spec_version,
    }


def detection_claims(
    detection: Detection, keys: Sequence[KeyMaterial], *, input_kind: str, input_sha256: str
) -> dict[str, Any]:
    """The claims of one detection (`Detector.detect`) by `keys`.

    Args:
        detection: the verdict.
        keys: every key tested (the reported one among them).
        input_kind: "text", "token_ids" or "prompt_and_token_ids".
        input_sha256: `wmark.receipts.text_sha256` or `token_ids_sha256` of the input.
    """
    return {
        "input": {"kind": input_kind, "sha256": input_sha256},
        "key": key_claims(keys, detection.key_id),
        "detection": {
            "method": "detect",
            "verdict": detection.verdict,
            "log_p": real(detection.log_p),
            "score": real(detection.score),
            "n_scored": detection.n_scored,
            "n_tokens": detection.n_tokens,
            "alpha": real(detection.alpha),
            "keys_tested": len(keys),
            "reading": detection.reading,
            "n_readings": detection.n_readings,
        },
    }
