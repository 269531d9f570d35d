"""A generation's text as its tokens come: what each block adds, never a broken character.

Byte-level BPE tokenizers split some characters over several tokens, so decoding the tokens so
far can end in U+FFFD until the rest arrives, and some decoders rewrite earlier text (a leading
space, a merged pair) once more tokens follow. A `TextStream` decodes the whole sequence on each
step and hands out only text that extends what it already handed out and does not end
mid-character; `rest` gives what is left of the final text. The service's streamed responses
and `wmark generate --stream` both print through it. Where a decoder rewrites text already
handed out, that text cannot be taken back and the stream stops growing; with byte-level BPE
(the embedded pair) the text of a prefix only grows, and what is shown is the final text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextStream"]


class TextStream:
    """Text deltas of a growing token sequence (see the module).

    Args:
        decode: token IDs -> text (the model pair's decoder).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._sent = ""

    def delta(self, ids: Sequence[int]) -> str:
        """The text the new tokens `ids` add, held back ("") while it ends mid-character or is
        not yet an extension of what was handed out."""
        self._ids.extend(ids)
        text = self._decode(self._ids)
        if text.endswith("\ufffd") or not text.startswith(self._sent):
            return ""
        new, self._sent = text[len(self._sent) :], text
        return new

    def rest(self, final: str) -> str:
        """What is left of the generation's `final` text ("" if the decoder rewrote text that
        was already handed out: it cannot be taken back)."""
        return final[len(self._sent) :] if final.startswith(self._sent) else ""
