"""Which readings of a text the detector tests, decided from the text alone.

A reading is a text the detector tokenises and scores in place of the submitted one. Testing
m readings and keeping the best costs a Bonferroni factor m on the p-value; choosing the
reading from the text alone costs nothing, because a choice that never looks at the key
leaves the text's tokens independent of the key under H0, so the chosen reading's p-value is
exact. So this module decides what it can from the text and tests two readings only where the
text cannot tell:

- A text that carries an **edit mark**, something a language model does not write but an
  attacker's edit leaves (a format character outside an emoji sequence, a no-break or other
  compatibility space, a fullwidth or mathematical letter or digit, a word that mixes ASCII
  letters with look-alikes from another script, decomposed accents, a line break other than
  LF), is read canonically only (`wmark.detector.normalize`): its raw tokens are the attack's.
- A text without marks that normalisation still changes (doubled spaces, trailing spaces,
  lines of spaces only: a model writes these too, in aligned code comments, Markdown, or the
  indented blank lines of code) is read both ways, with the factor 2.
- Each reading is then **unwrapped** if its lines were hard-wrapped (every break the greedy
  wrap of a paragraph at the text's widest line would make: a model's paragraphs are single
  long lines), and put into **sentence case** if written in one case throughout.

Unwrapping and recasing keep the text's length, so a reading's character map (for per-token
evidence on the submitted characters) is its base's.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Mapping

from wmark.detector.normalize import (
    NormalizedText,
    canonical_text,
    confusable_folds,
    invisible_chars,
    normalize,
)

__all__ = [
    "case_forms",
    "edit_marks",
    "reading_texts",
    "restored",
    "sentence_case",
    "text_variants",
    "unwrap",
    "warm_tables",
]

# A sentence starts after the text's start, a full stop (and closing quotes or emphasis) and
# space, a Markdown label ("**Label:** text") or a line break; Markdown list marks, numbers,
# headings, emphasis and opening quotes may stand before its first letter.
_SENTENCE_START = re.compile(
    r"(^|[.!?][\"')\]*_\u201d\u2019]*\s+|:\*\*\s+|\n\s*)"
    r"((?:[-*+>#]+\s+)*(?:\d+[.)]\s+)?[*_\"'(\[\u201c\u2018]*)([a-z])"
)
_LONE_I = re.compile(r"\bi\b")
_LOWER_SENTENCE = re.compile(  # a sentence that starts in lower case after a full stop, ! or ?
    r"[a-z0-9%)\]\"'`*_\u201d\u2019][.!?][\"')\]*_\u201d\u2019`]*\s+[\"'(\[*_`\u201c\u2018]*[a-z]"
)
_WORDS = re.compile(r"[^\W\d_]+")
# bytes of UTF-8 text -> "a" (a-z), "A" (A-Z and bytes of non-ASCII characters), " " (the rest)
_CASE_CLASSES = bytes(
    ord("a") if 0x61 <= b <= 0x7A else ord("A") if 0x41 <= b <= 0x5A or b >= 0x80 else ord(" ")
    for b in range(256)
)
# a fenced code block: the opening fence (group 1), its info string (2), the code (3), the
# closing fence (4: consumed, so that it does not open another block)
_CODE_BLOCK = re.compile(r"^([ \t]*```)([^\n]*\n)(.*?)(^[ \t]*```|\Z)", re.M | re.S)
_PYTHON_TAGS = frozenset({"", "py", "python", "python3"})
# a comment's first letter, or a docstring's: right after its quotes, or on the next line when
# the quotes open the body of a def or class (a closing quote is followed by a line break)
_COMMENT_START = re.compile(r"(#+[ \t]*|//[ \t]*|:\n[ \t]*(?:\"\"\"|\'\'\')\s*|\"\"\"|\'\'\')([a-z])")
# the section headings of Google- and NumPy-style docstrings, alone on their line
_DOC_SECTION = re.compile(
    r"^([ \t]+)(args|arguments|returns|raises|yields|examples?|notes?|attributes|parameters)(?=:?\n)", re.M
)
_PY_CONSTANTS = re.compile(r"\b(?:true|false|none)\b")
_ASCII_MARKS = re.compile(r"[\r\x0b\x0c\x1c-\x1e]")  # line breaks other than LF
# compatibility spaces and line breaks, fullwidth letters and digits, mathematical alphanumerics
_COMPAT_MARKS = re.compile(
    "[\x85\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
    "\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\U0001d400-\U0001d7ff]"
)
_LETTER = re.compile(r"[^\W\d_]")  # a letter of a word (what \w matches, less digits and "_")
_ASTRAL_LETTER = re.compile(r"[^\W\d_\x00-\uffff]")  # a letter above U+FFFF
# joiners and selectors that belong to emoji sequences (ZWJ, text/emoji presentation, tags)
_EMOJI_GLUE = frozenset("\u200d\ufe0e\ufe0f") | frozenset(map(chr, range(0xE0020, 0xE0080)))
_SPACED_WORD = re.compile(r"(?<= )[a-z]{2,}\b")  # a lower-case word after a space, mid-line
_WORD_TOKEN = re.compile(r"(?:\u0120|\u2581)([A-Za-z]{2,})")  # byte-level "Ġ" / SentencePiece "▁"
_WRAP_WIDTHS = (30, 100)  # hard wraps are at 40-80 columns (e-mail 72, terminals 80)
_MIN_WRAPS = 3


Forms = Callable[[], Mapping[str, str]]  # a tokenizer's `case_forms` table, built when first needed


def sentence_case(text: str, forms: Forms | None = None) -> str | None:
    """A sentence-case reading of a text written in one case throughout, else None.

    Generated prose is lower case with capitals at sentence starts; a text whose letters are
    all upper case, all lower case, or whose words all start with a capital (title case) was
    most likely recased, and this reading recovers most of its tokens. Fenced code blocks
    (```) are read as code: lower case but for comment and docstring starts and, in Python,
    True/False/None. With `forms` (gives `case_forms` of the tokenizer's vocabulary), a word after
    a space takes the casing the tokenizer says it usually has ("texas" -> "Texas"). The reading
    has the text's length, character for character, so the text's character map serves it too.
    """
    all_upper = text.isupper()  # str methods: every cased character, at C speed
    # lower case throughout is also how code and identifiers look: only prose, where a sentence
    # then starts in lower case after a full stop and a space or line break, gets the reading
    # (one such start is enough: a model's answer is never all lower case, so the rule only
    # decides between a recased answer and lower-case code, whose full stops sit inside names)
    all_lower = text.islower() and _LOWER_SENTENCE.search(text) is not None
    if not (all_upper or all_lower) and not _may_be_title(text):
        return None
    words = _WORDS.findall(text)
    if len(words) < 5:
        return None
    title = sum(w[0].isupper() for w in words) >= 0.9 * len(words)
    if not (all_upper or all_lower or title) or sum(map(len, words)) < 20:
        return None
    lowered = text.lower()
    if len(lowered) != len(text):
        return None  # a case mapping that changes length ("İ"): no character map, no reading
    table = forms() if forms is not None else {}
    out, done = [], 0
    for block in _CODE_BLOCK.finditer(lowered):
        out.append(_prose_case(lowered[done : block.start(3)], table))
        out.append(_code_case(block.group(3), python=block.group(2).strip() in _PYTHON_TAGS))
        done = block.end(3)
    out.append(_prose_case(lowered[done:], table))
    return "".join(out)


def _prose_case(text: str, forms: Mapping[str, str]) -> str:
    recased = _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2) + m.group(3).upper(), text)
    if forms:
        recased = _SPACED_WORD.sub(lambda m: forms.get(m.group(), m.group()), recased)
    return _LONE_I.sub("I", recased)


def case_forms(vocab: Mapping[str, int]) -> dict[str, str]:
    """Lower-case word -> the casing a tokenizer's vocabulary says it is usually written in.

    A BPE vocabulary's IDs follow its merges, most frequent first, so of the tokens " texas",
    " Texas" and " TEXAS" the one with the smallest ID is the form the tokenizer's training
    text used most. A word is listed when that form is not lower case and its ID is less than
    half the lower-case form's (or there is none): proper nouns and acronyms ("Texas" 8257,
    "texas" 59248 in Qwen2's vocabulary), not words that merely start many sentences
    ("However" 4354, "however" 4764). Tokens are read in the byte-level ("Ġword") and
    SentencePiece ("▁word") spellings of a word after a space; a vocabulary with neither gives
    an empty table.
    """
    ids: dict[str, dict[str, int]] = {}  # lower-case word -> its casings' token IDs
    for token, token_id in vocab.items():
        match = _WORD_TOKEN.fullmatch(token)
        if match is None:
            continue
        word = match.group(1)
        if word in (word.lower(), word.capitalize(), word.upper()):  # not "iPhone", "McDonald"
            ids.setdefault(word.lower(), {})[word] = token_id
    out = {}
    for lower, casings in ids.items():
        usual = min(casings, key=casings.__getitem__)
        if usual != lower and (lower not in casings or 2 * casings[usual] < casings[lower]):
            out[lower] = usual
    return out


def _code_case(code: str, *, python: bool) -> str:
    """Lower-case code as its author wrote it, where convention says: keywords and names stay
    lower case, comments and docstrings start with a capital (and so do docstring section
    headings such as "Args:"), Python's constants are capitalised."""
    code = _COMMENT_START.sub(lambda m: m.group(1) + m.group(2).upper(), code)
    code = _DOC_SECTION.sub(lambda m: m.group(1) + m.group(2).capitalize(), code)
    if python:
        code = _PY_CONSTANTS.sub(lambda m: m.group().capitalize(), code)
    return code


def _may_be_title(text: str) -> bool:
    """False when counting bytes shows that fewer than 90% of the words of `text` can start
    with a capital (the title-case test of `sentence_case`, ruled out at C speed).

    Words that start with a-z after an ASCII non-letter are some of the words N that do not
    start with a capital; the capitals (A-Z, or a non-ASCII character, which has a byte above
    0x7f) bound the words U that do. Title case needs U >= 0.9 (U + N), so N <= U / 9; the
    margin of one word covers the rounding of 0.9 * len(words).
    """
    classes = text.encode("utf-8").translate(_CASE_CLASSES)
    lower_starts = classes.count(b" a") + classes.startswith(b"a")
    return 9 * lower_starts <= classes.count(b"A") + 9


def edit_marks(text: str) -> bool:
    """Whether `text` carries a mark of an edit that a language model does not make (see the
    module docstring); at C speed (regular expressions, the Unicode ones built on first use)."""
    if _ASCII_MARKS.search(text):
        return True
    if text.isascii():
        return False
    if _COMPAT_MARKS.search(text) or not unicodedata.is_normalized("NFC", text):
        return True
    return _stray_invisible(text) or _mixed_word(text)


def warm_tables() -> None:
    """Build the Unicode tables and regular expressions that `edit_marks` and the canonical
    reading build on first use (~0.1 s): a service calls this at start-up, not on a request."""
    _invisible(), _mixed_word_bmp(), _mixed_word_astral()
    canonical_text("\uff37\u0430rm\u200b")  # a fullwidth letter, a look-alike, an invisible


def _stray_invisible(text: str) -> bool:
    """Whether `text` holds an invisible character (`is_invisible`) outside an emoji sequence."""
    return any(not _in_emoji(text, match.start()) for match in _invisible().finditer(text))


def _mixed_word(text: str) -> bool:
    """Whether a word of `text` (a run of letters: what \\w matches, less digits and "_") holds
    an ASCII letter and a look-alike of one from another script (`confusable_folds`)."""
    if _mixed_word_bmp().search(text):
        return True
    return _ASTRAL_LETTER.search(text) is not None and _mixed_word_astral().search(text) is not None


@functools.cache
def _invisible() -> re.Pattern[str]:
    """Any invisible character (built once). The class of the 424 characters is tested only on
    non-ASCII ones (ASCII is skipped at C speed by the bitmap of the first class)."""
    return re.compile(rf"[^\x00-\x7f](?<=[{_ranges([ord(ch) for ch in invisible_chars()])}])")


@functools.cache
def _mixed_word_bmp() -> re.Pattern[str]:
    """Where a word (a run of letters) holds an ASCII letter and a look-alike of one below
    U+10000 (a letter of `confusable_folds`), built once from the fold table.

    A word holds both iff somewhere in it the two stand with only other non-ASCII letters
    between them (of its ASCII letters and look-alikes in order, two neighbours of the two
    kinds: whatever stands between them is neither). Each match starts at such a pair's first
    non-ASCII letter (the regex engine skips ASCII text at C speed) and looks behind for the
    ASCII letter or the look-alike before it; the letters between are a class without the
    look-alikes and ASCII letters, so a match attempt stops at the next one: one pass over the
    text.
    """
    looks = [ord(ch) for ch in confusable_folds() if _LETTER.fullmatch(ch) and ord(ch) <= 0xFFFF]
    look = f"[{_ranges(sorted(looks))}]"
    other = rf"[^\W\d_A-Za-z{look[1:-1]}]*"  # other letters (and look-alikes above U+FFFF)
    after_ascii = rf"(?<=[A-Za-z].)(?:(?<={look})|{other}{look})"
    return re.compile(rf"[^\W\d_\x00-\x7f](?:{after_ascii}|(?<={look}){other}[A-Za-z])")


@functools.cache
def _mixed_word_astral() -> re.Pattern[str]:
    """`_mixed_word_bmp` for the look-alikes above U+FFFF (Deseret, Osage, mathematical letters...),
    which the regex engine tests one range after another: only for text with such letters."""
    looks = [ord(ch) for ch in confusable_folds() if _LETTER.fullmatch(ch) and ord(ch) > 0xFFFF]
    look = f"[{_ranges(sorted(looks))}]"
    other = r"[^\W\d_A-Za-z]*"
    return re.compile(rf"[A-Za-z]{other}{look}|{look}{other}[A-Za-z]")


def _ranges(codes: list[int]) -> str:
    """A regex character class's body that holds the sorted code points `codes`, as ranges."""
    spans: list[list[int]] = []
    for c in codes:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return "".join(rf"\U{a:08x}" if a == b else rf"\U{a:08x}-\U{b:08x}" for a, b in spans)


def _in_emoji(text: str, at: int) -> bool:
    """Whether the invisible character at `at` glues an emoji sequence (after a symbol)."""
    if text[at] not in _EMOJI_GLUE or at == 0:
        return False
    before = text[at - 1]
    return before in _EMOJI_GLUE or unicodedata.category(before) in ("So", "Sk")


def unwrap(text: str) -> str | None:
    """`text` with the line breaks of a hard wrap made spaces again, or None if it has none.

    A break is a wrap when the next line's first word would not have fitted on the line at the
    width of the text's widest line (what a greedy wrap does); breaks before blank or indented
    lines, and after a line ending in a space, are structure and stay. The text counts as
    wrapped when its widest line has 30 to 100 characters and at least three breaks, and half
    of those between two text lines, are wraps: a model writes a paragraph as one line. Verse
    with even lines in that range reads as wrapped too; that costs power, never validity.
    """
    if text.count("\n") < _MIN_WRAPS:
        return None
    lines = text.split("\n")
    width = max(map(len, lines))
    if not _WRAP_WIDTHS[0] <= width <= _WRAP_WIDTHS[1]:
        return None
    wraps, breaks = [], 0
    for i in range(len(lines) - 1):
        line, after = lines[i], lines[i + 1]
        if not line or not after or line[-1].isspace() or after[0].isspace():
            continue
        breaks += 1
        if len(line) + 1 + len(after.split(" ", 1)[0]) > width:
            wraps.append(i)
    if len(wraps) < _MIN_WRAPS or 2 * len(wraps) < breaks:
        return None
    joined = set(wraps)
    return "".join(line + (" " if i in joined else "\n") for i, line in enumerate(lines[:-1])) + lines[-1]


def restored(text: str, forms: Forms | None = None) -> str:
    """A reading's text unwrapped and recased where the text shows it was (same length)."""
    unwrapped = unwrap(text)
    text = text if unwrapped is None else unwrapped
    recased = sentence_case(text, forms)
    return text if recased is None else recased


def reading_texts(text: str, forms: Forms | None = None) -> list[str]:
    """The texts of `text_variants(text, forms)`, without character maps (what detection
    without offsets needs; ASCII text at C speed)."""
    canonical = canonical_text(text)
    bases = [canonical] if edit_marks(text) else [text, canonical]
    out: list[str] = []
    for base in bases:
        reading = restored(base, forms)
        if reading not in out:
            out.append(reading)
    return out


def text_variants(text: str, forms: Forms | None = None) -> list[NormalizedText]:
    """The readings of `text` the detector tests, each mapped to the submitted characters.

    One reading unless the text has no edit mark and normalisation still changes it; then the
    text as submitted first and its canonical form second (see the module docstring). `forms`:
    the tokenizer's usual casings for the sentence-case reading (`case_forms`).
    """
    canonical = normalize(text)
    bases = [canonical] if edit_marks(text) else [NormalizedText.identity(text), canonical]
    out: list[NormalizedText] = []
    for base in bases:
        reading = restored(base.text, forms)
        if all(reading != seen.text for seen in out):
            out.append(NormalizedText(reading, base.starts, base.ends, base.original_length))
    return out
