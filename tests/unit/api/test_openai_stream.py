"""The service's stream reply: its text deltas are always a prefix of the final text, and never
half a character (byte-level BPE decodes a split UTF-8 sequence to U+FFFD until its last byte comes)."""

from __future__ import annotations

from collections.abc import Sequence

from wmark.api.generate_routes import _Reply

# token -> bytes; "é" is two bytes split over tokens 2 and 3
PIECES = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b" ok"}


def _decode(ids: Sequence[int]) -> str:
    return b"".join(PIECES[i] for i in ids).decode("utf-8", "replace")


def test_deltas_wait_for_whole_characters():
    reply = _Reply(chat=True, model="m", decode=_decode)
    assert [reply.text.delta([i]) for i in (1, 2, 3, 4)] == ["caf", "", "é", " ok"]


def test_a_decoder_that_rewrites_earlier_text_is_held_until_the_end():
    texts = iter(["a b", "ab c", "ab cd"])  # the second decode rewrites "a b": not an extension
    reply = _Reply(chat=False, model="m", decode=lambda _ids: next(texts))
    assert reply.text.delta([1]) == "a b"
    assert reply.text.delta([2]) == "" and reply.text.delta([3]) == ""  # nothing sent that must be taken back
