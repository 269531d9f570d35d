"""The readings the detector tests are decided from the text alone (no Bonferroni factor where
the text shows what was done to it), and map back to the submitted characters."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from wmark.detector.readings import edit_marks, reading_texts, sentence_case, text_variants, unwrap
from wmark.eval.attacks import attacked

CLEAN = "The river floods in spring.\nFarmers plant after the water recedes.\n    indented line"
PARAGRAPH = (
    "Rivers flood in spring because snow melts in the mountains and the water runs down into "
    "the valleys, where it spreads over the fields. Farmers plant after the water recedes, since "
    "the silt left behind is rich, na\u00efve as it sounds. In short: floods bring water and soil."
)
ANSWER = f"{PARAGRAPH}\n\n- first point\n- second point\n\n{PARAGRAPH}"


def test_ordinary_text_has_one_reading_so_no_correction() -> None:
    assert [v.text for v in text_variants(CLEAN)] == [CLEAN]


def test_text_with_edit_marks_is_read_canonically_only() -> None:
    attacked_text = CLEAN.replace(" ", " \u200b")
    assert [v.text for v in text_variants(attacked_text)] == [CLEAN]


@pytest.mark.parametrize(
    "name",
    ["zero-width-50", "homoglyph-5", "homoglyph-20", "homoglyph-100", "fullwidth-20", "fullwidth-100"]
    + ["respace", "line-ends", "unicode-nfd", "reflow-60", "case-upper", "case-title"],
)
def test_each_character_attack_gets_one_reading_that_is_the_answer(name: str) -> None:
    """One reading (no correction), and it is the answer itself: the attacks leave marks, or
    re-wrap or recase in a way the text shows."""
    answer = ANSWER
    if name.startswith("case"):
        answer = answer.replace("- first", "First").replace("- second", "Second")  # no list marks
    text = attacked(name, answer, seed=3, doc="answer")
    assert text != answer
    readings = reading_texts(text)
    assert len(readings) == 1, name
    if not name.startswith("case"):  # line-ends too: a blank line's added space goes
        assert readings[0] == answer, name
    else:
        # sentence case restores every word but those capitalised inside a sentence
        got, want = readings[0].split(), answer.split()
        assert len(got) == len(want) and sum(a != b for a, b in zip(got, want, strict=True)) == 0


def test_doubled_spaces_alone_are_read_both_ways() -> None:
    """A model writes two spaces too (aligned comments): without a mark, both readings."""
    code = "x = 1  # one\ny = 2  # two\n"
    assert [v.text for v in text_variants(code)] == [code, "x = 1 # one\ny = 2 # two\n"]


def test_a_models_own_lines_of_spaces_are_read_both_ways() -> None:
    """A model may write a blank line of code with its indentation ("\\n    \\n"); spaces alone
    are no edit mark, so the text as written is one reading (the factor 2 is the cost) and the
    canonical one, with the line emptied, the other."""
    code = "def f(x):\n    y = x\n    \n    return y\n"
    canonical = "def f(x):\n    y = x\n\n    return y\n"
    assert not edit_marks(code)
    assert [v.text for v in text_variants(code)] == reading_texts(code) == [code, canonical]
    # with an edit mark, the canonical reading alone: the model's indented blank line is lost
    assert reading_texts(code.replace("\n", "\r\n")) == [canonical]


def test_blank_lines_given_spaces_by_an_edit_read_as_the_answer() -> None:
    edited = ANSWER.replace("\n\n", "\n  \n")
    assert not edit_marks(edited)
    assert reading_texts(edited) == [edited, ANSWER]
    assert reading_texts(edited.replace("\n", "\r\n")) == [ANSWER]


def test_emoji_sequences_and_foreign_words_are_not_edit_marks() -> None:
    assert not edit_marks("We met \U0001f469\u200d\U0001f4bb and \u2764\ufe0f it, merci \u00e0 tous.")
    assert not edit_marks("Moscow is \u041c\u043e\u0441\u043a\u0432\u0430; \u03b1-helix; \u4e2d\u6587\u3002")
    assert edit_marks("the riv\u0435r")  # a Cyrillic "e" inside a Latin word
    assert edit_marks("zero\u200bwidth")
    assert edit_marks("a\u00a0b") and edit_marks("\uff52iver") and edit_marks("line\r\n")


@pytest.mark.parametrize("width", [40, 60, 72, 80])
def test_a_hard_wrapped_answer_is_unwrapped(width: int) -> None:
    wrapped = "\n".join("\n".join(textwrap.wrap(p, width)) if p else p for p in ANSWER.split("\n"))
    assert wrapped != ANSWER
    assert unwrap(wrapped) == ANSWER
    assert reading_texts(wrapped) == [ANSWER]


@pytest.mark.parametrize(
    "text",
    [
        ANSWER,
        "def f(x):\n    return x\n\nprint(f(1))\nprint(f(2))\nprint(f(3))\n",
        "Roses are red,\nviolets are blue,\nsugar is sweet,\nand so are you.",
        "- one\n- two\n- three\n- four\n- five",
    ],
)
def test_text_that_was_not_wrapped_is_left_alone(text: str) -> None:
    assert unwrap(text) is None


@pytest.mark.parametrize("recase", [str.upper, str.lower, str.title])
def test_text_in_one_case_throughout_is_read_in_sentence_case(recase: object) -> None:
    prose = "The river floods in spring. Farmers plant after the water recedes. I think it helps."
    assert callable(recase)
    assert [v.text for v in text_variants(recase(prose))] == [prose]


@pytest.mark.parametrize(
    "prose",
    [
        # one sentence start, after a line break: a 50-token answer's opening
        "Okay, let me explain this like you're five:\nImagine a leaf is a green crayon. For a long time"
        " it stays green",
        # a full stop after a number or a closing quote
        "The ferry cuts emissions by 90%. The route opens next week",
        'The program prints "done". Then it counts on',
    ],
)
def test_lower_case_prose_with_one_sentence_start_is_read_in_sentence_case(prose: str) -> None:
    assert [v.text for v in text_variants(prose.lower())] == [prose]


def test_mixed_case_prose_gets_no_sentence_case_reading() -> None:
    prose = "Paris is in France. The Seine runs through it. Many people visit each year."
    assert len(text_variants(prose)) == 1


def test_lower_case_code_gets_no_sentence_case_reading() -> None:
    code = "def total(items):\n    return sum(item.price for item in items)\n\nprint(total(cart))\n"
    assert [v.text for v in text_variants(code)] == [code]


def test_readings_map_every_character_back_to_the_submitted_text() -> None:
    text = attacked("zero-width-100", ANSWER, seed=1, doc="d").upper()
    (reading,) = text_variants(text)
    assert len(reading.starts) == len(reading.text)
    for i, ch in enumerate(reading.text):
        source = text[reading.starts[i] : reading.ends[i]]
        assert source.lower().replace("\u200b", "") == ch.lower(), (i, ch, source)


def test_reading_texts_are_the_texts_of_the_readings() -> None:
    rng = np.random.default_rng(8)
    alphabet = list("ab. \t\n\r\x0b\x1fI\u00e9\u200b\u0430")
    samples = ["".join(rng.choice(alphabet, size=int(rng.integers(1, 30)))) for _ in range(2000)]
    samples += [CLEAN, CLEAN.upper(), CLEAN.replace(" ", "  "), "THE RIVER. IT FLOODS. I SEE IT NOW."]
    samples += ["\n".join(textwrap.wrap(PARAGRAPH, 50)), "\n".join(textwrap.wrap(PARAGRAPH, 50)).upper()]
    for text in samples:
        assert reading_texts(text) == [v.text for v in text_variants(text)], repr(text)


def test_the_title_case_bound_never_rules_out_title_case_text() -> None:
    """_may_be_title may only say False where the words are not 90% capitalised; texts near
    the threshold (85-95% capitalised words, some non-ASCII) exercise both answers."""
    import re

    from wmark.detector.readings import _may_be_title

    rng = np.random.default_rng(10)
    vocab = ["river", "Flood", "\u00e9t\u00e9", "\u00c9t\u00e9", "x1y", "_a", "it's", "B", "c"]
    answers = set()
    for _ in range(3000):
        words = [vocab[int(i)] for i in rng.integers(0, len(vocab), size=int(rng.integers(5, 60)))]
        share = rng.uniform(0.85, 0.95)
        words = [w[:1].upper() + w[1:] if rng.random() < share else w for w in words]
        text = " ".join(words)
        found = re.findall(r"[^\W\d_]+", text)
        title = sum(w[0].isupper() for w in found) >= 0.9 * len(found)
        answers.add(_may_be_title(text))
        assert _may_be_title(text) or not title, text
    assert answers == {True, False}


def test_sentence_case_capitalises_markdown_sentence_starts() -> None:
    answer = (
        "Sleep helps in three ways:\n\n1. **Rebuilding cells:** When we sleep, cells mend.\n"
        '- **Memory:** The brain files the day. "It works," she said. Then it ends.\n'
        "### Why it matters\n> Rest is repair."
    )
    assert [v.text for v in text_variants(answer.upper())] == [answer]
    assert [v.text for v in text_variants(answer.lower())] == [answer]


def test_sentence_case_reads_fenced_code_as_code() -> None:
    answer = (
        "Here is the function.\n\n```python\ndef first(items):\n"
        '    """Return the first item, or None.\n\n    Args:\n        items: any iterable.\n    """\n'
        "    for i in items:\n        return i  # Found one\n    return None\n```\n\n"
        "It stops at the first item. If the list is empty, it returns nothing."
    )
    # two readings: the comment's two spaces may be the model's (no edit mark says otherwise)
    assert [v.text for v in text_variants(answer.upper())] == [answer, answer.replace("  #", " #")]


def test_case_forms_list_words_a_vocabulary_writes_capitalised() -> None:
    from wmark.detector.readings import case_forms

    vocab = {
        "\u0120the": 10,
        "\u0120The": 20,  # lower case first: not listed
        "\u0120Texas": 100,
        "\u0120texas": 900,  # capitalised far earlier: listed
        "\u0120However": 40,
        "\u0120however": 50,  # starts sentences, but common lower case too
        "\u0120NASA": 300,  # no lower-case token at all
        "\u2581Paris": 70,
        "\u0120iPhone": 5,
        "Texan": 1,  # SentencePiece; odd casing; no space
    }
    assert case_forms(vocab) == {"texas": "Texas", "nasa": "NASA", "paris": "Paris"}


def test_sentence_case_takes_the_tokenizers_usual_casing_after_a_space() -> None:
    prose = "We flew from Texas to NASA in July. The trip, however, was long. Then we rested."
    forms = {"texas": "Texas", "nasa": "NASA", "july": "July"}
    assert [v.text for v in text_variants(prose.upper(), lambda: forms)] == [prose]
    assert sentence_case(prose.upper()) == prose.replace("Texas", "texas").replace("NASA", "nasa").replace(
        "July", "july"
    )


def test_a_docstring_opened_on_its_own_line_starts_with_a_capital() -> None:
    answer = (
        "The function is short. It keeps one value.\n\n```python\ndef keep(value):\n"
        '    """\n    Hold one value.\n    """\n\n    return value or None\n```\n'
    )
    assert [v.text for v in text_variants(answer.upper())] == [answer]


# The look-alike and invisible-character scans of `edit_marks` before they became regular
# expressions built from the tables: a Python loop over every non-ASCII character and every word
# that holds a non-ASCII letter. Kept as the reference the fast version must equal.
_REF_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_REF_NON_ASCII_WORD = re.compile(r"[^\W\d_]*[^\x00-\x7f\W\d_][^\W\d_]*")
_REF_ASCII_LETTER = re.compile(r"[A-Za-z]")


def _reference_invisible(text: str) -> bool:
    from wmark.detector.normalize import is_invisible
    from wmark.detector.readings import _in_emoji

    return any(
        is_invisible(m.group()) and not _in_emoji(text, m.start()) for m in _REF_NON_ASCII.finditer(text)
    )


def _reference_mixed_word(text: str) -> bool:
    from wmark.detector.normalize import confusable_folds

    folds = confusable_folds()
    for match in _REF_NON_ASCII_WORD.finditer(text):
        word = match.group()
        if _REF_ASCII_LETTER.search(word) and any(ch in folds for ch in word):
            return True
    return False


def _reference_edit_marks(text: str) -> bool:
    import unicodedata

    from wmark.detector.readings import _ASCII_MARKS, _COMPAT_MARKS

    if _ASCII_MARKS.search(text):
        return True
    if text.isascii():
        return False
    if _COMPAT_MARKS.search(text) or not unicodedata.is_normalized("NFC", text):
        return True
    return _reference_invisible(text) or _reference_mixed_word(text)


def _mixed_script_texts(count: int, seed: int) -> list[str]:
    """Latin words with look-alikes from the whole fold table swapped in (Cyrillic, Greek,
    Cherokee, Deseret, Roman numerals...), look-alikes that are not letters (Devanagari zero,
    "×"), other non-ASCII letters (accents, CJK, Hangul, a letter above U+FFFF), emoji with ZWJ,
    presentation selectors and tags, combining marks, digits and "_" inside words; now and then
    an invisible or compatibility character."""
    from wmark.detector.normalize import confusable_folds

    folds = confusable_folds()
    looks = sorted(ch for ch in folds if re.fullmatch(r"[^\W\d_]", ch))
    symbols = sorted(ch for ch in folds if not re.fullmatch(r"[^\W\d_]", ch))
    common = list("\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455")
    common += list("\u0391\u039f\u03bf\u03bd\u0131")
    others = ["\u00e9t\u00e9", "stra\u00dfe", "\u0436\u0431", "\u4e2d\u6587", "\u3042", "\ud55c"]
    others += ["\U00020000"]
    others += ["\u216b", "\u00aa", "\u02bc", "\u0915\u093f", "\u0301", "\u0663", "1", "_", "'", "-"]
    emoji = ["\U0001f469\u200d\U0001f4bb", "\u2764\ufe0f", "\U0001f600", "\U0001f3f4\U000e0067\U000e007f"]
    rare = ["\u200b", "\u200d", "\ufe0f", "\u00ad", "\u2060", "\u00a0", "\U0001d41a", "e\u0301"]
    words = ["river", "a", "I", "spring", "x", "ok", "The"]
    rng = np.random.default_rng(seed)

    def pick(pool: list[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    texts = []
    for _ in range(count):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            r = rng.random()
            if r < 0.35:  # a Latin word, maybe with look-alikes or other letters inside
                word = list(pick(words))
                for i in range(len(word)):
                    if rng.random() < 0.15:
                        word[i] = pick(common) if rng.random() < 0.5 else pick(looks)
                    elif rng.random() < 0.08:
                        word[i] = pick(others + symbols)
                parts.append("".join(word))
            elif r < 0.5:
                parts.append(pick(looks) + pick(others))
            elif r < 0.75:
                parts.append(pick(others))
            elif r < 0.85:
                parts.append(pick(symbols))
            elif r < 0.95:
                parts.append(pick(emoji))
            else:
                parts.append(pick(rare))
            parts.append(pick(["", "", " ", " ", "\n", ".", "-", "_", "2"]))
        texts.append("".join(parts))
    return texts


def test_edit_marks_equals_the_reference_on_mixed_script_text() -> None:
    """The regular expressions built from the fold table and the invisible characters give
    exactly the answers of the old per-character loops, on every text and for each scan on its
    own (the early returns of `edit_marks` would hide most of the second scan)."""
    from wmark.detector.readings import _mixed_word, _stray_invisible

    texts = _mixed_script_texts(4000, seed=14)
    mixed = invisible = marked = 0
    for text in texts:
        want = _reference_mixed_word(text)
        assert _mixed_word(text) == want, repr(text)
        mixed += want
        want = _reference_invisible(text)
        assert _stray_invisible(text) == want, repr(text)
        invisible += want
        want = _reference_edit_marks(text)
        assert edit_marks(text) == want, repr(text)
        marked += want
    n = len(texts)
    assert 0.2 * n < mixed < 0.8 * n and 0.05 * n < invisible < 0.5 * n and 0.2 * n < marked < 0.9 * n


@pytest.mark.parametrize(
    ("text", "mixed"),
    [
        ("the riv\u0435r", True),  # Cyrillic e inside
        ("\u0435asy", True),  # at the start
        ("rive\u0440", True),  # at the end
        ("r\u00e9\u0436\u0435", True),  # other non-ASCII letters between
        ("\u0440\u0435\u043a\u0430 river", False),  # a Russian word beside a Latin one
        ("riv_\u0435", False),  # "_" and digits end a word
        ("riv2\u0435", False),
        ("riv\u00d7er", False),  # "×" folds to "x" but is no letter
        ("x\u0301\u0435", False),  # a combining mark ends a word
        ("caf\u00e9 na\u00efve", False),  # accents are not look-alikes
        ("\U00010404k", True),  # Deseret capital O, above U+FFFF
        ("\U00020000\U00010404", False),  # a letter above U+FFFF, no ASCII letter
        ("\u2160I", True),  # Roman numeral one is a letter here
    ],
)
def test_mixed_words(text: str, mixed: bool) -> None:
    from wmark.detector.readings import _mixed_word

    assert _mixed_word(text) == _reference_mixed_word(text) == mixed
