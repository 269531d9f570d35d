"""The attack library: seeded and reproducible, each edit does what its name says, and every
edit a reader cannot see is undone by the detector's canonical reading."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from wmark.detector.normalize import normalize
from wmark.errors import InputError
from wmark.eval.attacks import ATTACKS, attacked, parse_attacks, reflow
from wmark.eval.lexicon import DEFAULT_WORDNET, WordNet

PROSE = (
    "The river floods in spring, and the farmers wait. When the water recedes, they plant rice "
    "in the rich soil it leaves behind.\nBy autumn the harvest is ready; the café by the bridge "
    "sells the first bowls. Children swim where the current is slow."
)
INVISIBLE = [
    "zero-width-50", "zero-width-100", "homoglyph-5", "homoglyph-20", "homoglyph-100",
    "fullwidth-20", "fullwidth-100", "respace", "line-ends",
    "unicode-nfc", "unicode-nfd", "unicode-nfkc", "unicode-nfkd",
]  # fmt: skip


@pytest.mark.parametrize(
    "name", [n for n, a in ATTACKS.items() if a.level != "model" and not n.startswith(("synonym", "paste"))]
)
def test_same_seed_same_text(name: str) -> None:
    assert attacked(name, PROSE, seed=0, doc="a") == attacked(name, PROSE, seed=0, doc="a")


@pytest.mark.parametrize(
    "name", ["homoglyph-20", "zero-width-50", "fullwidth-20", "respace", "delete-10", "insert-10", "swap-20"]
)
def test_random_edits_are_drawn_per_seed_and_per_document(name: str) -> None:
    once = attacked(name, PROSE, seed=0, doc="a")
    assert attacked(name, PROSE, seed=1, doc="a") != once
    assert attacked(name, PROSE, seed=0, doc="b") != once


@pytest.mark.parametrize("name", INVISIBLE)
def test_invisible_edits_change_the_text_but_not_its_canonical_reading(name: str) -> None:
    edited = attacked(name, PROSE, seed=3, doc="x")
    if name not in ("unicode-nfc", "unicode-nfkc"):  # PROSE is already NFC
        assert edited != PROSE
    assert normalize(edited).text == normalize(PROSE).text


def test_homoglyph_rate_is_the_share_of_replaceable_letters() -> None:
    edited = attacked("homoglyph-20", PROSE, seed=0, doc="r")
    changed = sum(a != b for a, b in zip(edited, PROSE, strict=True))
    letters = sum(c.isascii() and c.isalpha() for c in PROSE)
    # round(0.2 * replaceable) letters change; nearly every ASCII letter has a look-alike
    assert 0.15 * letters <= changed <= 0.2 * letters + 1
    assert all(not c.isascii() for a, c in zip(PROSE, edited, strict=True) if a != c)


def test_word_deletion_removes_the_share_of_words() -> None:
    words = PROSE.split()
    edited = attacked("delete-10", PROSE, seed=0, doc="d")
    alphabetic = [w for w in words if any(c.isalpha() for c in w)]
    assert len(words) - len(edited.split()) == round(0.1 * len(alphabetic))


def test_swap_keeps_the_words_and_changes_their_order() -> None:
    edited = attacked("swap-20", PROSE, seed=0, doc="s")
    assert edited != PROSE
    strip = lambda t: sorted(w.strip(".,;") for w in t.split())  # noqa: E731
    assert strip(edited) == strip(PROSE)


def test_recasing_and_reflow() -> None:
    assert attacked("case-upper", PROSE, seed=0, doc="c") == PROSE.upper()
    reflowed = attacked("reflow-60", PROSE, seed=0, doc="c")
    assert all(len(line) <= 60 for line in reflowed.split("\n"))
    assert reflowed.split() == PROSE.split()


def test_reflow_keeps_each_line_indentation() -> None:
    code = "def f(x):\n    return some_function(argument_one, argument_two, argument_three, argument_four)\n"
    reflowed = reflow(40)(code, np.random.default_rng(0))
    lines = reflowed.split("\n")
    assert lines[1].startswith("    return ") and not lines[2].startswith(" ")
    assert all(len(line) <= 40 for line in lines)
    assert reflowed.split() == code.split()


def test_unicode_forms_are_the_forms() -> None:
    assert attacked("unicode-nfd", PROSE, seed=0, doc="u") == unicodedata.normalize("NFD", PROSE)


@pytest.mark.skipif(not (DEFAULT_WORDNET / "index.noun").is_file(), reason="WordNet database not installed")
def test_synonyms_come_from_wordnet() -> None:
    wordnet = WordNet()
    assert "car" in [s.lower() for s in wordnet.synonyms("automobile")]
    assert wordnet.synonyms("qzxv") == []
    edited = attacked("synonym-20", PROSE, seed=0, doc="w")
    assert edited != PROSE and normalize(edited).text != PROSE
    assert attacked("synonym-20", PROSE, seed=0, doc="w") == edited


def test_wordnet_folder_without_the_database_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="wordnet-base"):
        WordNet(tmp_path)


def test_paste_makes_the_answer_the_given_share_of_the_document() -> None:
    for name in ("paste-10", "paste-25", "paste-50"):
        doc = attacked(name, PROSE, seed=0, doc="p")
        assert PROSE in doc
        share = len(PROSE) / len(doc)
        assert abs(share - ATTACKS[name].share) < 0.03, (name, share)


def test_parse_attacks_expands_groups_and_rejects_unknown_names() -> None:
    names = parse_attacks("char,delete-10")
    assert names[0] == "none" and "homoglyph-100" in names and names[-1] == "delete-10"
    with pytest.raises(InputError, match="unknown attack"):
        parse_attacks("delete-99")


def test_all_is_the_cheap_attacks_and_the_paraphrase_is_asked_for_by_name_or_group() -> None:
    everything = parse_attacks("all")
    assert "paraphrase" not in everything
    assert set(everything) == {n for n, a in ATTACKS.items() if a.level != "model"}
    assert parse_attacks("model") == parse_attacks("paraphrase") == ["none", "paraphrase"]
    assert parse_attacks("all,model")[-1] == "paraphrase"
    with pytest.raises(InputError, match="needs the target model"):
        attacked("paraphrase", PROSE, seed=0, doc="a")
