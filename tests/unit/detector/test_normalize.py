"""The canonical reading undoes invisible edits and maps every character back to the submitted text."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import numpy as np
import pytest

from wmark.detector.normalize import NormalizedText, normalize

CLEAN = "The river floods in spring.\nFarmers plant after the water recedes.\n    indented line"


@pytest.mark.parametrize(
    ("attacked", "why"),
    [
        (CLEAN.replace(" ", " \u200b"), "zero-width space after each space"),
        (CLEAN.replace("e", "\u0435").replace("a", "\u0430").replace("o", "\u043e"), "Cyrillic look-alikes"),
        (
            CLEAN.replace("T", "\u03a4").replace("p", "\u0440"),
            "Greek and Cyrillic capitals and small letters",
        ),
        (CLEAN.replace("r", "\uff52").replace("s", "\uff53"), "fullwidth letters"),
        (
            CLEAN.replace("in spring", "in\u00a0spring").replace("after", "after\u2003"),
            "no-break and em spaces",
        ),
        (CLEAN.replace("\n", "\r\n"), "CR LF line ends"),
        (
            CLEAN.replace("spring.", "spring.   ").replace("plant ", "plant  \t "),
            "spaces doubled and trailing",
        ),
        (unicodedata.normalize("NFD", CLEAN + " caf\u00e9"), "decomposed accents"),
        (CLEAN.replace("w", "w\u2060\ufeff\u00ad"), "word joiner, BOM, soft hyphen"),
    ],
)
def test_invisible_edits_normalise_to_the_clean_text(attacked: str, why: str) -> None:
    clean = CLEAN + (" caf\u00e9" if "caf" in attacked else "")
    assert attacked != clean, why
    assert normalize(attacked).text == clean, why


def test_indentation_is_kept_and_ascii_is_never_folded() -> None:
    text = "def f(l, I, O0):\n    return 1 | l\n\tx"
    assert normalize(text).text == text


def test_greek_capital_iota_folds_to_capital_i_not_small_l() -> None:
    assert normalize("\u0399t is \u0430 test").text == "It is a test"


def test_every_character_maps_back_to_the_characters_it_came_from() -> None:
    attacked = "a\u200bb\uff43  d\r\ne\u0301"
    norm = normalize(attacked)
    assert norm.text == "abc d\n\u00e9"
    spans = [attacked[s:e] for s, e in zip(norm.starts, norm.ends, strict=True)]
    assert spans == ["a", "b", "\uff43", "  ", "d", "\n", "e\u0301"]
    # a token "c d" of the canonical text covers the fullwidth c, both spaces and d
    assert norm.source_span(2, 5) == (3, 7)
    assert norm.source_span(6, 6) == (9, 9)  # empty span stays empty at its position
    assert norm.source_span(7, 9) == (len(attacked), len(attacked))


def test_identity_maps_each_character_to_itself() -> None:
    ident = NormalizedText.identity("abc")
    assert ident.map_offsets([(0, 2), (2, 3)]) == [(0, 2), (2, 3)]


def test_the_ascii_fast_path_never_skips_a_change() -> None:
    from wmark.detector.normalize import _canonical

    rng = np.random.default_rng(7)
    alphabet = list("ab. \t\n\r\x0b\x1f")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 12))))
        assert normalize(text).text == _canonical(text).text, repr(text)


def test_canonical_text_equals_the_mapped_path_on_every_kind_of_character() -> None:
    """canonical_text (C speed outside non-ASCII runs) against _canonical (cluster by cluster):
    combining marks after ASCII or after a format character, Hangul jamo and fillers, NFKC
    expansions, compatibility spaces, every line break, CR before a format character."""
    from wmark.detector.normalize import _canonical, canonical_text

    rng = np.random.default_rng(9)
    alphabet = list("aI1. \t\n\r\x0b\x0c\x1c\x1f") + list(
        "\u00e9\u0301\u0327\u0345\u200b\u2060\ufeff\u00ad\u034f\ufe0f\u0430\u0399\uff52\u00a0\u2003"
        "\u3000\u1680\x85\u2028\u2029\ufb01\u212b\u1100\u1161\u11a8\u1160\u3164\uac00\u0b47\u0b3e"
        "\u0915\u093f\u0130\u00df"
    )
    for _ in range(20000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 14))))
        assert canonical_text(text) == _canonical(text).text, repr(text)


def test_normalize_goes_cluster_by_cluster_only_in_chunks_that_may_change() -> None:
    """normalize (identity outside the chunks that may change) equals _canonical over the whole
    text: text and every character's span, on multi-line texts with every kind of edit."""
    from wmark.detector.normalize import _canonical

    rng = np.random.default_rng(11)
    alphabet = list("aI1. \t\n\n\n\r\x0b\x0c\x1c\x1f") + list(
        "\u00e9\u0301\u200b\u0430\uff52\u00a0\x85\u2028\u1100\u1161\u11a8\u3164"
    )
    for _ in range(20000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 30))))
        got, want = normalize(text), _canonical(text)
        assert (got.text, got.starts, got.ends) == (want.text, want.starts, want.ends), repr(text)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("a\n   \nb", "a\n\nb"),
        ("a\r\n \r\nb", "a\n\nb"),
        ("a\n\t\nb", "a\n\nb"),
        ("a\n\u00a0\nb", "a\n\nb"),
        ("a\n \u3000\u2003\t\nb", "a\n\nb"),
        ("a\n \u200b \nb", "a\n\nb"),
        ("a\n\x1f\nb", "a\n\nb"),
        ("a\n \r \x0b\t\u2028b", "a\n\n\n\nb"),
        ("  \t\nb", "\nb"),
        ("a\n   ", "a\n"),
        ("   ", ""),
        ("    x\n    \n    y\n", "    x\n\n    y\n"),
        (" \u0301\n", " \u0301\n"),  # a combining mark on a space is not a space
    ],
)
def test_a_line_of_spaces_only_becomes_empty(text: str, canonical: str) -> None:
    from wmark.detector.normalize import _canonical, canonical_text

    assert normalize(text).text == _canonical(text).text == canonical_text(text) == canonical


def test_an_emptied_line_keeps_the_map_of_its_line_breaks() -> None:
    text = "a \n \t\r\nb"
    norm = normalize(text)
    assert norm.text == "a\n\nb"
    assert [text[s:e] for s, e in zip(norm.starts, norm.ends, strict=True)] == ["a", "\n", "\n", "b"]
    assert norm.source_span(1, 3) == (2, 7)


# A model's answer: paragraphs and a code block, blank lines written "\n\n".
ANSWER = (
    "Here is the function.\n\n```python\ndef first(items):\n    for i in items:\n        return i\n\n"
    "    return None\n```\n\nIt stops at the first item.\n\n- one\n- two\n"
)


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda t: t.replace("\n\n", "\n   \n"), "spaces on blank lines"),
        (lambda t: t.replace("\n\n", "\n\t\n"), "a tab on blank lines"),
        (lambda t: t.replace("\n\n", "\n\u00a0\n"), "a no-break space on blank lines"),
        (lambda t: t.replace("\n\n", "\n    \n"), "indentation on blank lines (an editor's auto-indent)"),
        (lambda t: t.replace("\n", " \r\n"), "CR LF line ends after a trailing space on every line"),
        (
            lambda t: t.replace("\n", "\r\n").replace("\r\n\r\n", "\r\n \t \r\n"),
            "CR LF, spaces on blank lines",
        ),
    ],
)
def test_blank_lines_given_spaces_or_crlf_read_as_the_answer_itself(
    edit: Callable[[str], str], why: str
) -> None:
    """The canonical reading of the edited answer is exactly the answer's own, so its tokens are
    the answer's (tests/unit/detector/test_splice.py checks them with a tokenizer)."""
    from wmark.detector.normalize import canonical_text

    edited = edit(ANSWER)
    assert edited != ANSWER, why
    assert canonical_text(ANSWER) == ANSWER and normalize(ANSWER).text == ANSWER
    assert normalize(edited).text == canonical_text(edited) == ANSWER, why


def test_no_canonical_line_is_spaces_only() -> None:
    """Texts dense in lines of spaces (ASCII, compatibility and invisible ones, on every kind of
    line break, at the start and the end): the three paths agree, and no line of the canonical
    text holds only spaces."""
    from wmark.detector.normalize import _canonical, canonical_text

    rng = np.random.default_rng(12)
    pieces = [" ", "  ", "\t", "\n", "\n", "\r\n", "\r", "\u2028", "\x0b", "x", "  y"]
    pieces += ["\u00a0", "\u3000", "\u200b", "\x1f", "\u0301", "\u0430"]
    for _ in range(5000):
        text = "".join(pieces[int(i)] for i in rng.integers(0, len(pieces), size=int(rng.integers(1, 16))))
        got, want = normalize(text), _canonical(text)
        assert (got.text, got.starts, got.ends) == (want.text, want.starts, want.ends), repr(text)
        assert canonical_text(text) == want.text, repr(text)
        assert all(not line.isspace() for line in want.text.split("\n")), repr(text)


def test_invisible_chars_are_every_character_is_invisible_holds_true_for() -> None:
    from wmark.detector.normalize import invisible_chars, is_invisible

    every = "".join(map(chr, range(0x110000)))
    assert invisible_chars() == "".join(ch for ch in every if is_invisible(ch))
