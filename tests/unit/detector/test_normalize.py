"""The canonical reading undoes invisible edits and maps every character back to the submitted text."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from wmark.detector.normalize import NormalizedText, normalize, text_variants

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


def test_ordinary_text_has_one_reading_so_no_correction() -> None:
    assert [v.text for v in text_variants(CLEAN)] == [CLEAN]


def test_attacked_text_is_read_as_submitted_first_then_canonically() -> None:
    attacked = CLEAN.replace(" ", " \u200b")
    assert [v.text for v in text_variants(attacked)] == [attacked, CLEAN]


@pytest.mark.parametrize("recase", [str.upper, str.lower, str.title])
def test_text_in_one_case_throughout_gets_a_sentence_case_reading(recase: object) -> None:
    prose = "The river floods in spring. Farmers plant after the water recedes. I think it helps."
    assert callable(recase)
    readings = [v.text for v in text_variants(recase(prose))]
    assert readings[-1] == prose


def test_mixed_case_prose_gets_no_sentence_case_reading() -> None:
    prose = "Paris is in France. The Seine runs through it. Many people visit each year."
    assert len(text_variants(prose)) == 1


def test_lower_case_code_gets_no_sentence_case_reading() -> None:
    code = "def total(items):\n    return sum(item.price for item in items)\n\nprint(total(cart))\n"
    assert len(text_variants(code)) == 1


def test_the_ascii_fast_path_never_skips_a_change() -> None:
    from wmark.detector.normalize import _canonical

    rng = np.random.default_rng(7)
    alphabet = list("ab. \t\n\r\x0b\x1f")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 12))))
        assert normalize(text).text == _canonical(text).text, repr(text)


def test_reading_texts_are_the_texts_of_the_readings() -> None:
    from wmark.detector.normalize import reading_texts

    rng = np.random.default_rng(8)
    alphabet = list("ab. \t\n\r\x0b\x1fI\u00e9\u200b\u0430")
    samples = ["".join(rng.choice(alphabet, size=int(rng.integers(1, 30)))) for _ in range(2000)]
    samples += [CLEAN, CLEAN.upper(), CLEAN.replace(" ", "  "), "THE RIVER. IT FLOODS. I SEE IT NOW."]
    for text in samples:
        assert reading_texts(text) == [v.text for v in text_variants(text)], repr(text)
