"""Canonical text for detection: undo the edits a reader cannot see, keeping a map to the original.

An attacker can change a text's tokens, and with them every context window, without changing
what a reader sees: zero-width or other format characters, look-alike letters from another
script (Cyrillic "а" for Latin "a"), compatibility forms (fullwidth letters, no-break spaces),
decomposed accents, doubled spaces, CR LF line ends. `normalize` undoes these:

1. format characters (Unicode category Cf: zero-width space and joiners, word joiner, BOM,
   soft hyphen, bidi controls) and variation selectors are removed;
2. NFKC, applied per cluster (a base character and the combining marks or Hangul jamo that
   follow it), so every output character keeps the span of the characters it came from;
3. a non-ASCII character that Unicode's confusables data (TR39, via `confusable_homoglyphs`)
   lists as a look-alike of an ASCII letter or digit becomes that ASCII character (ASCII text
   itself is never folded: "l", "I" and "1" stay apart);
4. line breaks become "\\n", runs of spaces inside a line one space, spaces before a line
   break or at the end nothing; indentation at the start of a line is kept (code), but a line
   that holds only spaces becomes empty (a model writes a blank line as "\\n\\n"; "\\n \\n"
   tokenises differently).

Normalisation also changes legitimately generated text that uses these characters (a Russian
answer folded into Latin look-alikes, an aligned comment's two spaces). Which readings the
detector tests, the canonical one alone or beside the text as submitted, is decided from the
text in `wmark.detector.readings`, which also undoes re-wrapping and recasing.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "NormalizedText",
    "canonical_text",
    "confusable_folds",
    "invisible_chars",
    "is_invisible",
    "normalize",
]

_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
# Hangul fillers and the combining grapheme joiner render as nothing but are not category Cf.
_INVISIBLE = frozenset("\u034f\u115f\u1160\u3164\uffa0")
_OTHER_BREAKS = re.compile(r"[\r\x0b\x0c\x1c-\x1e]")
_NON_ASCII_BREAKS = re.compile("[\x85\u2028\u2029]")
_NON_ASCII_RUN = re.compile(r"[\x00-\x7f]?[^\x00-\x7f]+")
# Runs of spaces inside a line after a non-space: before a line break or the end (dropped), or
# before a non-space when not one space already (made one). Each pattern starts with a space
# character, so the regex engine skips everything else at C speed; the look-behind then checks
# the non-space before the run.
_TRAILING_RUN = re.compile(r"[^\S\n](?<=\S[^\S\n])[^\S\n]*(?=\n|\Z)")
_INNER_RUN = re.compile(r"[^\S\n](?<=\S[^\S\n])(?:(?<=[^ ])[^\S\n]*|[^\S\n]+)(?=\S)")
# A line that holds only spaces (after a line break or at the start, up to a line break or the
# end): its first space is not after a character other than a line break.
_BLANK_LINE = re.compile(r"[^\S\n](?<![^\n][^\S\n])[^\S\n]*(?=\n|\Z)")
# ASCII text that normalisation could change: a line break other than LF, spaces before a line
# break or at the end, or a run inside a line that is not one space (may over-match: then the
# slow path runs and finds nothing to change).
_ASCII_CHANGES_PATTERN = r"[\r\x0b\x0c\x1c-\x1e]|[^\S\n]+(?:\n|\Z)|(?<=\S)(?: [^\S\n]+|[^\S\n ])"
_ASCII_CHANGES = re.compile(_ASCII_CHANGES_PATTERN)
_MAY_CHANGE = re.compile(_ASCII_CHANGES_PATTERN + r"|[^\x00-\x7f]")  # ... or any non-ASCII text
_LINE_START = re.compile(r"[ \t]*[!-~]")  # a line that starts a chunk (see `normalize`)


@dataclass(frozen=True)
class NormalizedText:
    """A text derived from an original one, with each character's origin.

    Attributes:
        text: the derived text.
        starts, ends: for each character of `text`, the span [start, end) of the original
            characters it came from.
        original_length: length of the original text.
    """

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    original_length: int

    @classmethod
    def identity(cls, text: str) -> NormalizedText:
        """The text itself, each character its own origin."""
        return cls(text, tuple(range(len(text))), tuple(range(1, len(text) + 1)), len(text))

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original text that characters [start, end) of `text` came from.

        An empty span (a token that covers no whole character) maps to an empty span at the
        original position of `start`.
        """
        n = len(self.text)
        if start >= n:
            return self.original_length, self.original_length
        first = self.starts[start]
        if end <= start:
            return first, first
        return first, max(first, self.ends[min(end, n) - 1])

    def map_offsets(self, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Token offsets in `text` mapped to offsets in the original text."""
        return [self.source_span(s, e) for s, e in offsets]


def is_invisible(ch: str) -> bool:
    """Whether `ch` renders as nothing: a format character (Unicode category Cf), a variation
    selector, or a Hangul filler or the combining grapheme joiner."""
    if ch in _INVISIBLE or unicodedata.category(ch) == "Cf":
        return True
    cp = ord(ch)
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF  # variation selectors


@functools.cache
def invisible_chars() -> str:
    """Every character that `is_invisible` holds true for, in code point order (built on first
    use from Unicode's categories, ~0.1 s)."""
    category = unicodedata.category
    candidates = {chr(cp) for cp in range(0x110000) if category(chr(cp)) == "Cf"} | _INVISIBLE
    candidates.update(map(chr, [*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]))
    return "".join(sorted(ch for ch in candidates if is_invisible(ch)))


def _continues_cluster(ch: str) -> bool:
    # Combining marks, and Hangul medial vowels / final consonants (NFD splits a syllable into
    # jamo of combining class 0 that NFKC composes again).
    return unicodedata.combining(ch) != 0 or 0x1160 <= ord(ch) <= 0x11FF


def confusable_folds() -> dict[str, str]:
    """Non-ASCII character -> the ASCII letter or digit it is confusable with (a shared table:
    do not modify it)."""
    return _ascii_fold()


@functools.cache
def _ascii_fold() -> dict[str, str]:
    """Non-ASCII character -> the ASCII letter or digit it is confusable with."""
    from confusable_homoglyphs.confusables import confusables_data

    # The data links each character to its look-alikes (both ways); a connected class may hold
    # several ASCII characters ("l", "I", "1", "|"): `_pick` chooses.
    parent: dict[str, str] = {}

    def root(ch: str) -> str:
        while parent.setdefault(ch, ch) != ch:
            parent[ch] = parent[parent[ch]]
            ch = parent[ch]
        return ch

    for ch, entries in confusables_data.items():
        for entry in entries:
            if len(ch) == 1 and len(entry["c"]) == 1:
                parent[root(entry["c"])] = root(ch)
    classes: dict[str, list[str]] = {}
    for ch in parent:
        classes.setdefault(root(ch), []).append(ch)
    fold: dict[str, str] = {}
    for members in classes.values():
        candidates = sorted(m for m in members if m.isascii() and m.isalnum())
        if candidates:
            for m in members:
                if not m.isascii():
                    direct = [e["c"] for e in confusables_data.get(m, ()) if e["c"] in candidates]
                    fold[m] = _pick(m, direct, candidates)
    return fold


def _pick(look: str, direct: list[str], candidates: list[str]) -> str:
    """The ASCII character `look` stands for: its own prototype in the data if the case agrees,
    else a character of its class in the same case (Greek capital iota: "I", not "l")."""
    for pool in (direct, candidates):
        same_case = [c for c in pool if c.islower() == look.islower() and c.isupper() == look.isupper()]
        if same_case:
            return same_case[0]
    return (direct or candidates)[0]


def _clusters(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for i, ch in enumerate(text):
        if is_invisible(ch):
            continue
        if spans and _continues_cluster(ch) and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def normalize(text: str) -> NormalizedText:
    """The canonical form of `text` (see the module docstring), mapped to the original.

    Args:
        text: the submitted text.

    Returns:
        The canonical text; `NormalizedText.source_span` maps its character spans back.
    """
    if text.isascii() and not _ASCII_CHANGES.search(text):
        return NormalizedText.identity(text)  # the common case, at C speed
    # Normalisation works line by line and keeps printable ASCII and the indentation before it
    # (a line of spaces alone becomes empty), so the text is the canonical forms of its chunks
    # (text between line starts that hold printable ASCII after their indentation) laid end to
    # end: only chunks that may change go cluster by cluster.
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    done = 0
    for match in _MAY_CHANGE.finditer(text):
        if match.start() < done:
            continue  # inside the chunks already normalised
        lo, hi = _chunk_start(text, match.start()), _chunk_end(text, match.end())
        chars.append(text[done:lo])
        starts.extend(range(done, lo))
        ends.extend(range(done + 1, lo + 1))
        part = _canonical(text[lo:hi])
        chars.append(part.text)
        starts.extend([s + lo for s in part.starts])
        ends.extend([e + lo for e in part.ends])
        done = hi
    chars.append(text[done:])
    starts.extend(range(done, len(text)))
    ends.extend(range(done + 1, len(text) + 1))
    return NormalizedText("".join(chars), tuple(starts), tuple(ends), len(text))


def _chunk_start(text: str, at: int) -> int:
    """The last chunk boundary at or before `at` (0, or a line start after a "\n" whose line
    holds printable ASCII after its indentation)."""
    start = text.rfind("\n", 0, at) + 1
    while start > 0 and not _LINE_START.match(text, start):
        start = text.rfind("\n", 0, start - 1) + 1
    return start


def _chunk_end(text: str, at: int) -> int:
    """The first chunk boundary at or after `at` (or the end of the text)."""
    end = at if at > 0 and text[at - 1] == "\n" else text.find("\n", at) + 1
    while 0 < end < len(text) and not _LINE_START.match(text, end):
        end = text.find("\n", end) + 1
    return end or len(text)


def canonical_text(text: str) -> str:
    """`normalize(text).text` without the character map, at C speed outside non-ASCII runs.

    The same two stages as `_canonical`, each over the whole text: characters (CR LF, then
    each non-ASCII run: `_visible_run`), then line breaks and spaces (regular expressions).
    """
    text = text.replace("\r\n", "\n")  # a CR before an LF is always a cluster of its own
    if not text.isascii():
        text = _NON_ASCII_RUN.sub(_visible_run, text)
        text = _NON_ASCII_BREAKS.sub("\n", text)
    text = _OTHER_BREAKS.sub("\n", text)
    return _INNER_RUN.sub(" ", _TRAILING_RUN.sub("", _BLANK_LINE.sub("", text)))


class _CharTable(dict[int, str]):
    """ord(ch) -> what `_canonical` writes for ch as a cluster of its own, filled on first use
    (a `str.translate` table: the distinct characters of real text are few)."""

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        out = "" if is_invisible(ch) else _fold_all(unicodedata.normalize("NFKC", ch))
        self[cp] = out
        return out


_CHARS = _CharTable()


def _fold_all(text: str) -> str:
    fold = _ascii_fold()
    return "".join(fold.get(ch, ch) for ch in text)


def _visible_run(match: re.Match[str]) -> str:
    """The character stage of `_canonical` for one non-ASCII run and the character before it
    (a combining mark at the run's start belongs to that character's cluster)."""
    run = match.group()
    if not any(_continues_cluster(ch) for ch in set(run)):
        return run.translate(_CHARS)  # every character is a cluster of its own
    return "".join(_fold_all(unicodedata.normalize("NFKC", run[s:e])) for s, e in _clusters(run))


def _canonical(text: str) -> NormalizedText:
    fold = _ascii_fold()
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []

    def emit(ch: str, s: int, e: int) -> None:
        chars.append(ch)
        starts.append(s)
        ends.append(e)

    pending_space: tuple[int, int] | None = None  # a run of spaces inside a line, not yet written
    at_line_start = True
    line_start = 0  # where the current line starts in `chars`

    def drop_blank_line() -> None:  # a line of spaces only (its indentation, so far) goes
        del chars[line_start:], starts[line_start:], ends[line_start:]

    for s, e in _clusters(text):
        cluster = "".join(ch for ch in text[s:e] if not is_invisible(ch))
        if cluster == "\r" and e < len(text) and text[e] == "\n":
            continue  # CR LF: the LF writes the break
        for ch in unicodedata.normalize("NFKC", cluster):
            ch = fold.get(ch, ch)
            if ch in _LINE_BREAKS:
                pending_space = None  # spaces before a line break go
                if at_line_start:
                    drop_blank_line()
                emit("\n", s, e)
                at_line_start = True
                line_start = len(chars)
            elif ch.isspace():
                if at_line_start:
                    emit(ch, s, e)  # indentation is kept as written
                elif pending_space is None:
                    pending_space = (s, e)
                else:
                    pending_space = (pending_space[0], e)
            else:
                if pending_space is not None:
                    emit(" ", *pending_space)
                    pending_space = None
                emit(ch, s, e)
                at_line_start = False
    if at_line_start:
        drop_blank_line()
    return NormalizedText("".join(chars), tuple(starts), tuple(ends), len(text))
