"""Signed receipts of scan rows (`wmark scan --receipts`).

A scan row's receipt is the same Ed25519-signed receipt as `wmark detect --receipt` gives
(`wmark.receipts`, docs/receipts.md), checked offline the same way (`wmark receipt verify`):
its input is the SHA-256 of the document's text as scanned (UTF-8), its key the row's key, and
its detection the row's verdict with `"method": "scan"` (the decision p-value is family-wise
over the keys, the whole document and its windows). The driver signs, as each task's rows come
back: the private key never travels to a worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from wmark.detector.receipt import key_claims
from wmark.keymaterial import KeyMaterial
from wmark.receipts import ReceiptSigner, real, text_sha256
from wmark.scan.rows import ScanRow

__all__ = ["ScanReceipts", "scan_claims"]


def _real(x: float | None) -> str | None:
    return None if x is None else real(x)


def scan_claims(
    row: ScanRow, text: str, keys: Sequence[KeyMaterial], *, alpha: float, min_window: int
) -> dict[str, Any]:
    """The claims of one scanned document's row (not an error row).

    Args:
        row: the document's row, as the scan writes it.
        text: the document's text as scanned.
        keys: every key the scan tested (the row's key among them).
        alpha: the scan's significance level per document.
        min_window: the scan's shortest window (`--window`; 0: whole documents only).
    """
    if row.verdict == "error" or row.key_id is None or row.log_p is None:
        raise ValueError(f"{row.source} {row.doc_id}: an error row has no verdict to sign")
    window = None
    if row.window_start is not None:
        window = {
            "start": row.window_start,
            "end": row.window_end,
            "start_char": row.window_start_char,
            "end_char": row.window_end_char,
            "n_scored": row.window_n_scored,
            "p_value": _real(row.window_p_value),
            "p_raw": _real(row.window_p_raw),
            "n_windows": row.n_windows,
        }
    return {
        "input": {"kind": "text", "sha256": text_sha256(text)},
        "key": key_claims(keys, row.key_id),
        "detection": {
            "method": "scan",
            "verdict": row.verdict,
            "log_p": real(row.log_p),
            "n_scored": row.n_scored,
            "n_tokens": row.n_tokens,
            "alpha": real(alpha),
            "keys_tested": len(keys),
            "whole_p_value": _real(row.whole_p_value),
            "min_window": min_window,
            "window": window,
            "source": row.source,
            "doc_id": row.doc_id,
        },
    }


class ScanReceipts:
    """Signs the rows of one scan run.

    Args:
        signer: the registry's active receipt key (`ReceiptKeys.signer`).
        keys: the keys the scan tests.
        alpha, min_window: the scan's settings.
        audit_seq: the audit row of this run of the scan (written when it starts, before the
            first receipt: a scan's audit row is per run, not per document).
    """

    def __init__(
        self,
        signer: ReceiptSigner,
        keys: Sequence[KeyMaterial],
        *,
        alpha: float,
        min_window: int,
        audit_seq: int,
    ) -> None:
        self.signer = signer
        self.keys = tuple(keys)
        self.alpha = alpha
        self.min_window = min_window
        self.audit_seq = audit_seq

    def __repr__(self) -> str:
        return f"ScanReceipts({self.signer!r}, audit_seq={self.audit_seq})"

    def sign(self, row: ScanRow, text: str) -> ScanRow:
        """The row with its receipt; an error row as it is (it has no verdict)."""
        if row.verdict == "error":
            return row
        claims = scan_claims(row, text, self.keys, alpha=self.alpha, min_window=self.min_window)
        return dataclasses.replace(row, receipt=self.signer.sign(claims, audit_seq=self.audit_seq))
