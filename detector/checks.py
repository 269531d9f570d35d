"""Checks of a detection's inputs: text, token IDs, the significance level.

Each raises the error the service and the CLI report as bad input (`InputError`), or too little
to test (`InsufficientTextError`), or a token ID that is not the key's tokenizer's
(`TokenizerError`), before any work is done.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from wmark.errors import InputError, InsufficientTextError, TokenizerError
from wmark.keymaterial import KeyMaterial

__all__ = ["check_alpha", "check_text", "check_token_ids", "check_unicode", "check_vocabulary"]


def check_unicode(text: str) -> None:
    """Text a tokenizer can read: no unpaired surrogate.

    A JSON "\\ud800" escape (or a database driver) can give a `str` that is not valid Unicode;
    the tokenizers refuse it with a TypeError, so it is refused here as bad input.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"not valid Unicode text (an unpaired surrogate at character {exc.start})") from None


def check_text(text: str) -> None:
    """Text to detect: not blank, and valid Unicode."""
    if not text.strip():
        raise InsufficientTextError("the text is empty")
    check_unicode(text)


def check_alpha(alpha: float) -> None:
    """The significance level of a verdict: a number strictly between 0 and 1."""
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")


def check_token_ids(token_ids: Sequence[int] | npt.NDArray[np.integer] | None) -> npt.NDArray[np.uint32]:
    """Token IDs given instead of text, as uint32; a clear error for anything else."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError("token_ids must be a flat list of integers")
    if arr.size == 0:
        raise InsufficientTextError("token_ids is empty")
    if arr.min() < 0 or arr.max() > 0xFFFFFFFF:
        raise InputError("token IDs must be between 0 and 2^32 - 1")
    return arr.astype(np.uint32)


def check_vocabulary(ids: npt.NDArray[np.uint32], key: KeyMaterial) -> None:
    """Token IDs to score under `key`: not empty, and inside its tokenizer's vocabulary."""
    if len(ids) == 0:
        raise InsufficientTextError("the text has no tokens")
    if int(ids.max()) >= key.spec.tokenizer.vocab_size:
        raise TokenizerError(
            f"token ID {int(ids.max())} is outside key {key.key_id}'s vocabulary "
            f"({key.spec.tokenizer.vocab_size}): the IDs come from another tokenizer"
        )
