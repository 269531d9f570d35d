"""The canonical reading's token IDs without tokenising the whole text again.

Most texts that get a canonical reading differ from it in a few lines (a trailing space, two
spaces before a comment, a look-alike letter), yet tokenising the reading costs as much as
tokenising the text. For the byte-level BPE tokenizers whose pre-tokeniser is GPT-4's regex
(Qwen2, Llama 3), a text splits into *chunks* at every line start whose line holds a printable
ASCII character after its indentation (`[ \\t]*[!-~]` after a "\\n"):

- no pre-token crosses such a boundary (the only matches that hold a "\\n" end with it or are
  whitespace-only, and the line after it is not), so a text's tokens are its chunks' tokens
  laid end to end;
- `canonical_text` works line by line and keeps printable ASCII and the indentation before
  it (a line of spaces alone becomes empty), so the canonical text is the chunks' canonical
  texts laid end to end, with the same boundaries.

So only the chunks that normalisation changes are tokenised again, and their tokens replace
the text's own. Which chunks may change is read off the text's tokens (`SpliceTables`): a
token with a character other than printable ASCII and spaces/tabs/"\\n", a run of spaces or
tabs after a non-space that is not one space before a non-space, or a line of spaces and tabs
only (which becomes empty), inside a token or across several. The tests hold the result
equal to tokenising the canonical text, token for token, on many texts. Any other tokenizer
(another pre-tokeniser, a normaliser, an added token that could span a line) is not spliced:
`SpliceTables.from_json` returns None and the caller tokenises the reading in full.

Which chunks may change is found by `wmark.detector._fastsplice` (C) where it is built, else by
`_changed_chunks_reference` (numpy), its definition.
"""

from __future__ import annotations

import array
import functools
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from wmark.detector.normalize import canonical_text

_fastsplice: ModuleType | None
try:  # the compiled scan of a text's tokens; `_changed_chunks_reference` defines it
    import wmark.detector._fastsplice as _fastsplice
except ImportError:  # pragma: no cover - only on an install built without a C compiler
    _fastsplice = None

__all__ = ["SpliceTables", "canonical_readings"]

# GPT-4's pre-tokeniser (cl100k) as Qwen2 (one digit per pre-token) and Llama 3 (up to three)
# write it; both have the boundary property above.
_SAFE_PATTERNS = frozenset(
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    + digits
    + "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    for digits in ("", "{1,3}")
)
_ASCII_SPACE = frozenset(b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")  # str.isspace() in ASCII
_RUN_CHARS = frozenset(b" \t\x1f")  # spaces inside a line (the other ASCII spaces break lines)
_PLAIN = bytes(range(0x20, 0x7F)) + b"\t\n"
_INNER_RUN = re.compile(rb"[^ \t\n\x0b\x0c\r\x1c-\x1f][ \t\x1f]")  # a non-space, then a space
_BLANK_LINE = re.compile(rb"\n[ \t]+\n")  # a line of spaces and tabs only, inside a token
_OPENS = re.compile(rb"\n[ \t]*\Z")  # after the last "\n", spaces and tabs only (or nothing)
_CLOSES = re.compile(rb"\A[ \t]*\n")  # before the first "\n", spaces and tabs only (or nothing)


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token string."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


@dataclass(frozen=True)
class SpliceTables:
    """Per token ID, what splicing needs to know about its bytes.

    Attributes:
        byte_len: the token's length in UTF-8 bytes of the text.
        site: a character normalisation may change (not printable ASCII, space, tab or "\\n"),
            a non-space followed by a space inside the token, or a line of spaces and tabs only
            between two "\\n" of the token (added tokens: always).
        ends_solid: the last byte is not an ASCII space.
        starts_run: the first byte is a space, tab or \\x1f (a run inside a line starts here).
        one_space: the token is a space followed by a non-space (a run of exactly one space).
        lone_space: the token is " ".
        starts_solid: the first byte is not an ASCII space.
        ends_line: the last byte is "\\n".
        line_start: the token is `[ \\t]*[!-~]...` (a line that is not blank starts here).
        blank: the token is spaces and tabs only.
        opens_line: the token holds a "\\n" and only spaces and tabs after its last one.
        closes_line: the token holds a "\\n" and only spaces and tabs before its first one.
        ends_space: the last byte is a space or tab.
    """

    byte_len: npt.NDArray[np.int64]
    site: npt.NDArray[np.bool_]
    ends_solid: npt.NDArray[np.bool_]
    starts_run: npt.NDArray[np.bool_]
    one_space: npt.NDArray[np.bool_]
    lone_space: npt.NDArray[np.bool_]
    starts_solid: npt.NDArray[np.bool_]
    ends_line: npt.NDArray[np.bool_]
    line_start: npt.NDArray[np.bool_]
    blank: npt.NDArray[np.bool_]
    opens_line: npt.NDArray[np.bool_]
    closes_line: npt.NDArray[np.bool_]
    ends_space: npt.NDArray[np.bool_]

    @classmethod
    def from_json(cls, tokenizer_json: bytes) -> SpliceTables | None:
        """The tables of a tokenizer whose tokens splice at line starts, else None."""
        config = json.loads(tokenizer_json)
        if not _splices(config):
            return None
        to_bytes = str.maketrans({ch: chr(b) for ch, b in _byte_alphabet().items()})
        tokens: dict[int, bytes] = {}
        for piece, token_id in config["model"]["vocab"].items():
            try:
                tokens[int(token_id)] = piece.translate(to_bytes).encode("latin-1")
            except UnicodeEncodeError:  # a character outside the byte-level alphabet
                return None
        added = {int(a["id"]): a["content"].encode("utf-8") for a in config.get("added_tokens") or ()}
        tokens.update(added)
        size = max(tokens) + 1
        token_ids = np.fromiter(tokens, dtype=np.int64, count=len(tokens))
        byte_len = np.zeros(size, dtype=np.int64)
        byte_len[token_ids] = [len(data) for data in tokens.values()]
        rows = np.zeros((size, len(_FLAGS)), dtype=np.bool_)
        rows[token_ids] = [_describe(data, token_id in added) for token_id, data in tokens.items()]
        return cls(byte_len, *rows.T.copy())

    @functools.cached_property
    def packed(self) -> npt.NDArray[np.uint16]:
        """Per token ID its flags as bits (bit i: `_FLAGS[i]`), what `_fastsplice` reads."""
        bits = np.zeros(len(self.byte_len), dtype=np.uint16)
        for i, name in enumerate(_FLAGS):
            bits |= getattr(self, name).astype(np.uint16) << i
        return bits


def _splices(config: dict[str, Any]) -> bool:
    """Whether a tokenizer.json is a byte-level BPE tokenizer with GPT-4's pre-tokeniser and
    nothing that could join text across a line start."""
    pre = config.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return False
    split, byte_level = steps
    model = config.get("model") or {}
    return (
        config.get("normalizer") is None
        and config.get("truncation") is None
        and config.get("padding") is None
        and split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") in _SAFE_PATTERNS
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level == {**byte_level, "type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
        and model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("byte_fallback")
        and all(
            not (a.get("lstrip") or a.get("rstrip") or a.get("single_word"))
            and not any(ch.isspace() for ch in a["content"])
            for a in config.get("added_tokens") or ()
        )
    )


_FLAGS = (
    "site",
    "ends_solid",
    "starts_run",
    "one_space",
    "lone_space",
    "starts_solid",
    "ends_line",
    "line_start",
    "blank",
    "opens_line",
    "closes_line",
    "ends_space",
)


def _describe(data: bytes, added: bool) -> tuple[bool, ...]:
    """The flags of `SpliceTables` for one token's bytes, in the order of `_FLAGS`."""
    if not data:
        return (True,) + (False,) * (len(_FLAGS) - 1)
    first, last, body = data[0], data[-1], data.lstrip(b" \t")
    odd = bool(data.translate(None, _PLAIN))  # a byte other than printable ASCII, tab, "\n"
    return (
        added or odd or _INNER_RUN.search(data) is not None or _BLANK_LINE.search(data) is not None,
        last not in _ASCII_SPACE,
        first in _RUN_CHARS,
        first == 0x20 and len(data) > 1 and data[1] not in _ASCII_SPACE,
        data == b" ",
        first not in _ASCII_SPACE,
        last == 0x0A,
        bool(body) and 0x21 <= body[0] <= 0x7E,
        not body,
        _OPENS.search(data) is not None,
        _CLOSES.match(data) is not None,
        last in (0x20, 0x09),
    )


def _changed_chunks(t: SpliceTables, ids: Sequence[npt.NDArray[np.uint32]]) -> list[list[tuple[int, int]]]:
    """For each text, the token spans [start, end) of the chunks that may differ from their
    canonical text, merged where they touch; every other chunk is its own canonical text
    (`_changed_chunks_reference`, in C where built)."""
    if _fastsplice is None:  # pragma: no cover - only on an install built without a C compiler
        return _changed_chunks_reference(t, ids)
    flat = np.concatenate(ids).astype(np.uint32, copy=False) if ids else np.empty(0, np.uint32)
    ends = np.cumsum([len(x) for x in ids], dtype=np.int64)
    found = np.frombuffer(_fastsplice.changed_chunks(t.packed, flat, ends), dtype=np.int64)
    out: list[list[tuple[int, int]]] = [[] for _ in ids]
    for text, lo, hi in found.reshape(-1, 3).tolist():
        out[text].append((lo, hi))
    return out


Span = tuple[int, int, int, int]  # a changed chunk: token span [lo, hi), byte span [lo, hi)


def _changed_spans(
    t: SpliceTables, ids: Sequence[npt.NDArray[np.uint32]]
) -> tuple[list[list[Span]], list[int]]:
    """`_changed_chunks` with each span's byte offsets in its text (the byte lengths of the
    tokens before it summed), and each text's length in bytes by its tokens; in C where built."""
    if _fastsplice is None:  # pragma: no cover - only on an install built without a C compiler
        return _changed_spans_reference(t, ids)
    if not ids:
        return [], []
    flat = np.concatenate(ids) if len(ids) != 1 else ids[0]
    flat = np.ascontiguousarray(flat, dtype=np.uint32)
    ends = array.array("q", itertools.accumulate(map(len, ids)))
    found, totals = _fastsplice.changed_spans(t.packed, t.byte_len, flat, ends)
    out: list[list[Span]] = [[] for _ in ids]
    values = array.array("q", found).tolist()
    for i in range(0, len(values), 5):
        out[values[i]].append((values[i + 1], values[i + 2], values[i + 3], values[i + 4]))
    return out, array.array("q", totals).tolist()


def _changed_spans_reference(
    t: SpliceTables, ids: Sequence[npt.NDArray[np.uint32]]
) -> tuple[list[list[Span]], list[int]]:
    """`_changed_spans` from `_changed_chunks_reference` and the tokens' byte lengths: its
    definition."""
    out: list[list[Span]] = []
    for toks, spans in zip(ids, _changed_chunks_reference(t, ids), strict=True):
        offsets = np.concatenate(([0], np.cumsum(t.byte_len[toks]))).tolist()
        out.append([(lo, hi, offsets[lo], offsets[hi]) for lo, hi in spans])
    return out, [int(t.byte_len[toks].sum()) for toks in ids]


def _changed_chunks_reference(
    t: SpliceTables, ids: Sequence[npt.NDArray[np.uint32]]
) -> list[list[tuple[int, int]]]:
    """`_changed_chunks` in numpy: the definition the C scan must equal.

    All texts at once: their tokens laid end to end, with each text's first token a boundary.
    """
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths
    n = int(lengths.sum())
    if n == 0:
        return [[] for _ in ids]
    flat = np.concatenate(ids)
    first = np.zeros(n + 1, dtype=np.bool_)
    first[firsts] = True
    first[n] = True  # "the next token" of the last one is the end of its text
    site = t.site[flat]
    # a run of spaces after a non-space in the same text that is not one space before a non-space
    nxt_solid = t.starts_solid[flat[1:]] & ~first[1:n]
    run = t.ends_solid[flat[:-1]] & t.starts_run[flat[1:]] & ~first[1:n]
    lone_ok = np.append(t.lone_space[flat[1:-1]] & nxt_solid[1:], False) if n > 1 else nxt_solid
    site[1:] |= run & ~(t.one_space[flat[1:]] | lone_ok)
    site |= _blank_line_ends(t, flat, first)
    sites = np.flatnonzero(site)
    if len(sites) == 0:
        return [[] for _ in ids]
    # line starts (a line holding printable ASCII after its indentation), and each text's start
    line = t.line_start[flat[1:]]
    line[:-1] |= t.blank[flat[1:-1]] & t.line_start[flat[2:]] & ~first[2:n]
    first[1:n] |= t.ends_line[flat[:-1]] & line
    bounds = np.flatnonzero(first)
    chunks = np.searchsorted(bounds, sites, side="right") - 1  # ascending: sites are
    chunks = chunks[np.append(True, chunks[1:] != chunks[:-1])]
    los, his = bounds[chunks], bounds[chunks + 1]
    docs = np.searchsorted(firsts, los, side="right") - 1
    out: list[list[tuple[int, int]]] = [[] for _ in ids]
    for d, lo, hi in zip(
        docs.tolist(), (los - firsts[docs]).tolist(), (his - firsts[docs]).tolist(), strict=True
    ):
        spans = out[d]
        if spans and spans[-1][1] == lo:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return out


def _blank_line_ends(
    t: SpliceTables, flat: npt.NDArray[np.uint32], first: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """The tokens that end a line of spaces and tabs only that spans tokens: the token with its
    closing "\\n", or a text's last token when the line ends the text.

    Such a line starts at a text's start or after a token that opens a line (ends with "\\n"
    and spaces), goes on through tokens of spaces only, and ends in a token that closes a line
    (starts with spaces and "\\n"); it is not empty unless the closing "\\n" directly follows
    another. A line of spaces between two "\\n" of one token is that token's `site`. The
    closing token lies in the line's chunk: no chunk starts inside a line of spaces.

    `flat` is the texts' tokens laid end to end, `first` marks each text's first token (and
    the end, at index len(flat)).
    """
    n = len(flat)
    blank = t.blank[flat]
    starts = first[:n]
    # the line holds only spaces so far, after each token: decided by the last token that is not
    # blank (or a text's first token), kept through blank ones
    reset = ~blank | starts
    last_reset = np.maximum.accumulate(np.where(reset, np.arange(n), 0))
    after = (t.opens_line[flat] | blank)[last_reset]
    before = starts.copy()
    before[1:] |= after[:-1]
    after_break = np.zeros(n, dtype=np.bool_)
    after_break[1:] = t.ends_line[flat[:-1]] & ~starts[1:]
    not_empty = t.starts_run[flat] | ~(starts | after_break)
    ends = before & t.closes_line[flat] & not_empty
    last = np.flatnonzero(first[1:])  # each text's last token (an empty text has none)
    ends[last] |= after[last] & t.ends_space[flat[last]]
    return ends


def canonical_readings(
    tables: SpliceTables,
    texts: Sequence[str],
    ids: Sequence[npt.NDArray[np.uint32]],
    encode_batch: Callable[[list[str]], list[npt.NDArray[np.uint32]]],
) -> list[tuple[str, npt.NDArray[np.uint32]] | None]:
    """Each text's canonical text and its token IDs, or None where it is the text itself.

    Args:
        tables: the tokenizer's `SpliceTables`.
        texts: the texts.
        ids: each text's token IDs under that tokenizer.
        encode_batch: the tokenizer's batch encoding. It gets one string per changed text: its
            changed chunks' canonical texts laid end to end, which tokenise as the chunks do
            (they meet at line starts).
    """
    plans: list[tuple[int, list[str], list[tuple[int, int]], list[int]]] = []
    found, totals = _changed_spans(tables, ids)
    for i, (text, toks, spans, total) in enumerate(zip(texts, ids, found, totals, strict=True)):
        if not spans:
            continue
        # byte offsets of the token boundaries (bytes are characters in ASCII text)
        data: str | bytes = text if text.isascii() else text.encode("utf-8")
        if total != len(data):  # not the tokenizer the tables describe: no splicing
            spans = [(0, len(toks), 0, len(data))]
        pieces: list[str] = []  # alternately unchanged text and a changed chunk's canonical text
        changed: list[tuple[int, int]] = []
        sizes: list[int] = []  # byte length of each changed chunk's canonical text
        done = 0
        for lo, hi, byte_lo, byte_hi in spans:
            raw = _text(data, byte_lo, byte_hi)
            canon = canonical_text(raw)
            if canon != raw:
                pieces.extend((_text(data, done, byte_lo), canon))
                changed.append((lo, hi))
                sizes.append(len(canon) if canon.isascii() else len(canon.encode("utf-8")))
                done = byte_hi
        if changed:
            pieces.append(_text(data, done, len(data)))
            plans.append((i, pieces, changed, sizes))
    encoded = encode_batch(["".join(p[1::2]) for _, p, _, _ in plans]) if plans else []
    out: list[tuple[str, npt.NDArray[np.uint32]] | None] = [None] * len(texts)
    for (i, pieces, changed, sizes), new in zip(plans, encoded, strict=True):
        canonical = "".join(pieces)
        ends = np.concatenate(([0], np.cumsum(tables.byte_len[new])))
        targets = np.cumsum(sizes)
        cuts = np.searchsorted(ends, targets)
        if cuts[-1] >= len(ends) or not np.array_equal(ends[cuts], targets):
            out[i] = (canonical, encode_batch([canonical])[0])  # pragma: no cover (tables agree)
            continue
        toks, done, start = ids[i], 0, 0
        parts: list[npt.NDArray[np.uint32]] = []
        for (lo, hi), cut in zip(changed, cuts.tolist(), strict=True):
            parts.extend((toks[done:lo], new[start:cut]))
            done, start = hi, cut
        parts.append(toks[done:])
        out[i] = (canonical, np.concatenate(parts).astype(np.uint32, copy=False))
    return out


def _text(data: str | bytes, start: int, end: int) -> str:
    return data[start:end] if isinstance(data, str) else data[start:end].decode("utf-8")
