"""`TextStream`: a generation's text block by block, never a broken character, ending in the
final text (the service's streamed responses and `wmark generate --stream` print through it)."""

from __future__ import annotations

from collections.abc import Sequence

from wmark.generator.text_stream import TextStream

# A byte-level vocabulary: token i is the byte i, so one character of UTF-8 can take several
# tokens and a decode of a prefix can end mid-character (U+FFFD), as with byte-level BPE.
WORD = "naïve café ☕ done"
IDS = list(WORD.encode("utf-8"))


def _bytes(ids: Sequence[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _stream(decode, blocks: list[list[int]], final: str) -> list[str]:
    text = TextStream(decode)
    pieces = [text.delta(block) for block in blocks]
    return [*pieces, text.rest(final)]


def test_pieces_join_to_the_final_text_and_never_break_a_character():
    for size in (1, 2, 3, 5):  # every block size splits some multi-byte character somewhere
        blocks = [IDS[i : i + size] for i in range(0, len(IDS), size)]
        pieces = _stream(_bytes, blocks, WORD)
        assert "".join(pieces) == WORD
        assert all("\ufffd" not in piece for piece in pieces)
    one_byte_blocks = _stream(_bytes, [[b] for b in IDS], WORD)
    assert one_byte_blocks[IDS.index(0xC3)] == ""  # the first byte of "ï" alone: held back
    assert one_byte_blocks[IDS.index(0xC3) + 1] == "ï"


def test_text_a_decoder_rewrites_is_held_back_until_it_extends_what_was_sent():
    # A decoder that drops a leading space until a second token follows (as some
    # SentencePiece decoders do): the first delta would have to be taken back, so it waits.
    def decode(ids: Sequence[int]) -> str:
        text = " ".join(f"w{i}" for i in ids)
        return text if len(ids) > 1 else text.strip()

    text = TextStream(decode)
    assert text.delta([1]) == "w1"
    assert text.delta([2]) == " w2"
    assert text.rest("w1 w2 w3") == " w3"  # what was handed out is "w1 w2"

    def rewrites(ids: Sequence[int]) -> str:
        return "ab" if len(ids) == 1 else "xyz"  # the second token changes the first's text

    text = TextStream(rewrites)
    assert text.delta([1]) == "ab"
    assert text.delta([2]) == ""  # "xyz" does not extend "ab": nothing more is sent
    assert text.rest("xyz") == ""  # and what was sent cannot be taken back
