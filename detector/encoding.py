"""An input as the keys read it: token IDs per tokenizer, one encoding per reading of the text.

A text is read as `wmark.detector.readings` decides (its canonical, unwrapped or recased
readings); `reading_ids` tokenises them, splicing the canonical reading from the text's own
tokens where the tokenizer allows it (`wmark.detector.splice`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.detector.readings import edit_marks, reading_texts, restored
from wmark.detector.splice import canonical_readings
from wmark.detector.tokenize import TextTokenizer
from wmark.errors import TokenizerError
from wmark.keymaterial import KeyMaterial

__all__ = ["Encoding", "Encodings", "distinct", "reading_ids"]


@dataclass(frozen=True)
class Encoding:
    """A text's token IDs under one tokenizer, with each token's character span when asked for.

    Offsets are spans of the submitted text, also for a canonical reading of it.
    """

    ids: npt.NDArray[np.uint32]
    offsets: list[tuple[int, int]] | None = None


class Encodings:
    """One input as every key reads it: tokenised once per distinct tokenizer, or raw token IDs.

    Per tokenizer, the encodings of the text's readings (`wmark.detector.readings`), each with
    token IDs different from all before it; the first is the submitted text's own unless the
    text carries marks of an edit, was re-wrapped or recased.
    """

    def __init__(
        self, by_tokenizer: Mapping[str, Sequence[Encoding]] | None = None, ids: Encoding | None = None
    ):
        self._by_tokenizer = {sha: tuple(encs) for sha, encs in (by_tokenizer or {}).items()}
        self._ids = ids

    def readings(self, key: KeyMaterial) -> tuple[Encoding, ...]:
        """Every reading `key` scores."""
        found = self._by_tokenizer.get(key.spec.tokenizer.sha256)
        if found is not None:
            return found
        if self._ids is None:
            raise TokenizerError(f"the input was not tokenised with key {key.key_id}'s tokenizer")
        return (self._ids,)


def reading_ids(
    tok: TextTokenizer, texts: Sequence[str], ids: Sequence[npt.NDArray[np.uint32]]
) -> list[list[npt.NDArray[np.uint32]]]:
    """The token IDs of every reading of each text (`reading_texts`), given the texts' own.

    The canonical reading is spliced from the text's tokens where the tokenizer allows it
    (`wmark.detector.splice`: only its changed lines are tokenised), else tokenised in full;
    an unwrapped or recased reading (rare) is tokenised in full. One batch call per kind of
    reading.
    """
    tables = tok.splice_tables
    if tables is None:
        variants = [reading_texts(t, tok.case_forms) for t in texts]
        todo = [(i, j, v) for i, vs in enumerate(variants) for j, v in enumerate(vs) if v != texts[i]]
        flat = tok.encode_batch([v for _, _, v in todo])
        out = [[ids[i]] * len(vs) for i, vs in enumerate(variants)]
        for (i, j, _), new in zip(todo, flat, strict=True):
            out[i][j] = new
        return out
    canonical = canonical_readings(tables, texts, ids, tok.encode_batch)
    bases: list[list[tuple[str, npt.NDArray[np.uint32]]]] = []
    for text, own, c in zip(texts, ids, canonical, strict=True):
        if c is None:
            bases.append([(text, own)])
        else:
            bases.append([c] if edit_marks(text) else [(text, own), c])
    out, redo = [], []
    for i, readings in enumerate(bases):
        row = []
        for j, (text, own) in enumerate(readings):
            row.append(own)
            reading = restored(text, tok.case_forms)
            if reading != text:
                redo.append((i, j, reading))
        out.append(row)
    for (i, j, _), new in zip(redo, tok.encode_batch([r for _, _, r in redo]), strict=True):
        out[i][j] = new
    return out


def distinct(encodings: Sequence[Encoding]) -> tuple[Encoding, ...]:
    """The encodings whose token IDs differ from every earlier one (the first always kept)."""
    out: list[Encoding] = []
    seen: set[bytes] = set()
    for enc in encodings:
        ids = np.ascontiguousarray(enc.ids, dtype=np.uint32).tobytes()  # equal bytes, equal IDs
        if ids not in seen:
            seen.add(ids)
            out.append(enc)
    return tuple(out)
