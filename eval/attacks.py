"""Edits an attacker makes to a watermarked text, as pure seeded transforms of the text.

Character level (what a reader does not see, and recasing), word level (deletion, insertion,
adjacent swap, WordNet synonyms), span level (the answer pasted into human text). Each attack
is `apply(text, rng) -> text`; the same text and seed give the same result. `ATTACKS` names
every attack for `wmark eval --attacks`.

Model attacks (level "model": the paraphrase) need a language model, so they are not
transforms of the text alone: they are named here, grouped under "model" and left out of "all"
(each costs a generation), and `wmark.eval.paraphrase` carries them out.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from wmark.errors import InputError
from wmark.eval.lexicon import WordNet

__all__ = [
    "ATTACKS",
    "Attack",
    "attack_names",
    "attack_rng",
    "attacked",
    "parse_attacks",
]

Level = Literal["none", "char", "word", "span", "model"]
Transform = Callable[[str, np.random.Generator], str]

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


@dataclass(frozen=True)
class Attack:
    """A named, seeded edit of a text.

    Attributes:
        name: how runs and tables call it ("homoglyph-20", "delete-10", "paste-25").
        level: char, word, span, model, or none (the unattacked text).
        apply: (text, rng) -> attacked text (a model attack's refuses: it needs the model).
        share: for span attacks, the share of the document the watermarked text makes up.
    """

    name: str
    level: Level
    apply: Transform
    share: float = 1.0


# -- character level ---------------------------------------------------------------------------


@functools.cache
def _look_alikes() -> dict[str, tuple[str, ...]]:
    """ASCII letter -> letters of other scripts that Unicode lists as its confusables.

    Compatibility forms (fullwidth, mathematical letters) are left out: NFKC maps them back,
    and `fullwidth` attacks with them separately.
    """
    from confusable_homoglyphs.confusables import confusables_data

    out: dict[str, tuple[str, ...]] = {}
    for letter in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        found = []
        for key, entries in confusables_data.items():
            if len(key) != 1 or key.isascii() or not key.isalpha():
                continue
            if unicodedata.normalize("NFKC", key) != key:
                continue
            if any(e["c"] == letter for e in entries) and _same_case(key, letter):
                found.append(key)
        if found:
            out[letter] = tuple(sorted(found))
    return out


def _same_case(a: str, b: str) -> bool:
    return a.isupper() == b.isupper() and a.islower() == b.islower()


def homoglyphs(rate: float) -> Transform:
    """Replace `rate` of the letters that have a look-alike in another script by one."""

    def apply(text: str, rng: np.random.Generator) -> str:
        table = _look_alikes()
        chars = list(text)
        where = [i for i, c in enumerate(chars) if c in table]
        for i in _choose(rng, len(where), rate):
            options = table[chars[where[i]]]
            chars[where[i]] = options[int(rng.integers(len(options)))]
        return "".join(chars)

    return apply


def zero_width(rate: float) -> Transform:
    """Insert a zero-width space after `rate` of the spaces."""

    def apply(text: str, rng: np.random.Generator) -> str:
        spaces = [i for i, c in enumerate(text) if c == " "]
        chosen = {spaces[i] for i in _choose(rng, len(spaces), rate)}
        return "".join(c + "\u200b" if i in chosen else c for i, c in enumerate(text))

    return apply


def fullwidth(rate: float) -> Transform:
    """Replace `rate` of the ASCII letters and digits by their fullwidth forms."""

    def apply(text: str, rng: np.random.Generator) -> str:
        chars = list(text)
        where = [i for i, c in enumerate(chars) if c.isascii() and c.isalnum()]
        for i in _choose(rng, len(where), rate):
            chars[where[i]] = chr(ord(chars[where[i]]) + 0xFEE0)
        return "".join(chars)

    return apply


def respace(text: str, rng: np.random.Generator) -> str:
    """Each space becomes a no-break space, two spaces, an en space or stays (a quarter each)."""
    options = ("\u00a0", "  ", "\u2002", " ")
    return "".join(options[int(rng.integers(4))] if c == " " else c for c in text)


def line_ends(text: str, rng: np.random.Generator) -> str:
    """Windows line ends, with trailing spaces on half of the lines."""
    lines = text.split("\n")
    return "\r\n".join(line + (" " if rng.random() < 0.5 else "") for line in lines)


def reflow(width: int) -> Transform:
    """Re-wrap every paragraph at `width` characters (spaces become line breaks); a line's
    indentation stays in front of its first piece, as editors wrap."""

    def apply(text: str, rng: np.random.Generator) -> str:  # noqa: ARG001 (deterministic)
        out = []
        for line in text.split("\n"):
            body = line.lstrip(" ")
            indent = line[: len(line) - len(body)]
            wrapped: list[str] = []
            current = ""
            for word in body.split(" "):
                if current and len(indent if not wrapped else "") + len(current) + 1 + len(word) > width:
                    wrapped.append(current)
                    current = word
                else:
                    current = f"{current} {word}" if current else word
            out.append(indent + "\n".join([*wrapped, current]))
        return "\n".join(out)

    return apply


def unicode_form(form: Literal["NFC", "NFD", "NFKC", "NFKD"]) -> Transform:
    """The text in a Unicode normalisation form."""

    def apply(text: str, rng: np.random.Generator) -> str:  # noqa: ARG001 (deterministic)
        return unicodedata.normalize(form, text)

    return apply


def recase(mode: Literal["upper", "lower", "title"]) -> Transform:
    """The whole text in upper case, lower case, or with every word capitalised."""

    def apply(text: str, rng: np.random.Generator) -> str:  # noqa: ARG001 (deterministic)
        if mode == "title":
            return re.sub(r"[A-Za-z]+", lambda m: m.group(0)[0].upper() + m.group(0)[1:], text)
        return text.upper() if mode == "upper" else text.lower()

    return apply


# -- word level ---------------------------------------------------------------------------------


def _choose(rng: np.random.Generator, n: int, rate: float) -> list[int]:
    """round(rate * n) distinct indices out of n, in increasing order."""
    k = min(n, int(round(rate * n)))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False)) if k else []


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


def _splice(text: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """Replace spans (start, end, new) of text; spans sorted and disjoint."""
    out, pos = [], 0
    for start, end, new in edits:
        out.append(text[pos:start])
        out.append(new)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def delete_words(rate: float) -> Transform:
    """Delete `rate` of the words, each with the space before it."""

    def apply(text: str, rng: np.random.Generator) -> str:
        words = _words(text)
        edits = []
        for i in _choose(rng, len(words), rate):
            start, end = words[i].span()
            if start > 0 and text[start - 1] == " ":
                start -= 1
            edits.append((start, end, ""))
        return _splice(text, edits)

    return apply


def insert_words(rate: float) -> Transform:
    """Insert `rate` x (number of words) words, each a copy of a random word of the text."""

    def apply(text: str, rng: np.random.Generator) -> str:
        words = _words(text)
        edits = []
        for i in _choose(rng, len(words), rate):
            filler = words[int(rng.integers(len(words)))].group(0).lower()
            start = words[i].start()
            edits.append((start, start, filler + " "))
        return _splice(text, edits)

    return apply


def swap_words(rate: float) -> Transform:
    """Swap `rate` of the words with the word after them (pairs do not overlap)."""

    def apply(text: str, rng: np.random.Generator) -> str:
        words = _words(text)
        pairs = len(words) // 2
        edits = []
        for p in _choose(rng, pairs, rate):
            a, b = words[2 * p], words[2 * p + 1]
            edits += [(a.start(), a.end(), b.group(0)), (b.start(), b.end(), a.group(0))]
        return _splice(text, edits)

    return apply


def synonyms(rate: float, lexicon: Callable[[], WordNet]) -> Transform:
    """Replace `rate` of the words by a WordNet synonym (of those that have one; case kept)."""

    def apply(text: str, rng: np.random.Generator) -> str:
        wordnet = lexicon()
        words = _words(text)
        options = [(m, wordnet.synonyms(m.group(0))) for m in words]
        replaceable = [(m, syn) for m, syn in options if syn]
        k = min(len(replaceable), int(round(rate * len(words))))
        chosen = sorted(rng.choice(len(replaceable), size=k, replace=False).tolist()) if k else []
        edits = []
        for i in chosen:
            match, syn = replaceable[i]
            new = syn[int(rng.integers(len(syn)))]
            if match.group(0)[0].isupper():
                new = new[0].upper() + new[1:]
            edits.append((match.start(), match.end(), new))
        return _splice(text, edits)

    return apply


# -- span level ---------------------------------------------------------------------------------


def paste_into(share: float, human: Callable[[], Sequence[str]]) -> Transform:
    """The text pasted into human text, making up `share` of the document's characters.

    The human text comes from `human()` (one document drawn at random, cycled if short); the
    answer goes at a random point between two of its lines or sentences.
    """

    def apply(text: str, rng: np.random.Generator) -> str:
        docs = human()
        if not docs:
            raise InputError("no human text to paste into")
        doc = docs[int(rng.integers(len(docs)))]
        need = int(round(len(text) * (1 - share) / share))
        filler = (doc + "\n") * (need // max(1, len(doc) + 1) + 1)
        filler = filler[:need]
        cut = int(rng.integers(len(filler) + 1))
        # move the cut to the next sentence or line end, so the answer is not glued to a word
        stop = re.search(r"[.\n]\s", filler[cut:])
        cut = cut + stop.end() if stop else len(filler)
        before, after = filler[:cut].rstrip(), filler[cut:].lstrip()
        return "\n\n".join(part for part in (before, text, after) if part)

    return apply


# -- the catalogue ------------------------------------------------------------------------------


@functools.cache
def _wordnet() -> WordNet:
    return WordNet()


@functools.cache
def _prose_cache() -> tuple[str, ...]:
    from wmark.eval.corpus import system_corpus

    return tuple(d.text for d in system_corpus(200) if d.kind == "prose")


def _catalogue() -> dict[str, Attack]:
    attacks = [Attack("none", "none", lambda text, rng: text)]  # noqa: ARG005
    attacks += [Attack(f"zero-width-{r}", "char", zero_width(r / 100)) for r in (50, 100)]
    attacks += [Attack(f"homoglyph-{r}", "char", homoglyphs(r / 100)) for r in (5, 20, 100)]
    attacks += [Attack(f"fullwidth-{r}", "char", fullwidth(r / 100)) for r in (20, 100)]
    attacks += [
        Attack("respace", "char", respace),
        Attack("line-ends", "char", line_ends),
        Attack("reflow-60", "char", reflow(60)),
    ]
    attacks += [
        Attack(f"unicode-{f.lower()}", "char", unicode_form(f)) for f in ("NFC", "NFD", "NFKC", "NFKD")
    ]
    attacks += [Attack(f"case-{m}", "char", recase(m)) for m in ("upper", "lower", "title")]
    for r in (5, 10, 20, 30):
        attacks += [
            Attack(f"delete-{r}", "word", delete_words(r / 100)),
            Attack(f"insert-{r}", "word", insert_words(r / 100)),
            Attack(f"swap-{r}", "word", swap_words(r / 100)),
            Attack(f"synonym-{r}", "word", synonyms(r / 100, _wordnet)),
        ]
    attacks += [
        Attack(f"paste-{s}", "span", paste_into(s / 100, _prose_cache), share=s / 100) for s in (10, 25, 50)
    ]
    attacks += [Attack("paraphrase", "model", _needs_model("paraphrase"))]
    return {a.name: a for a in attacks}


def _needs_model(name: str) -> Transform:
    def apply(text: str, rng: np.random.Generator) -> str:  # noqa: ARG001 (refuses)
        raise InputError(f"the {name} attack needs the target model (wmark.eval.paraphrase)")

    return apply


ATTACKS: dict[str, Attack] = _catalogue()

_GROUPS = {
    "char": [a.name for a in ATTACKS.values() if a.level == "char"],
    "word": [a.name for a in ATTACKS.values() if a.level == "word"],
    "span": [a.name for a in ATTACKS.values() if a.level == "span"],
    "model": [a.name for a in ATTACKS.values() if a.level == "model"],
}
_CHEAP = ("char", "word", "span")  # what "all" means: every attack that needs no model


def attacked(name: str, text: str, *, seed: int, doc: str) -> str:
    """Attack `name` applied to `text` with a generator seeded by (name, doc, seed).

    Args:
        name: an entry of `ATTACKS`.
        text: the text to edit.
        seed: the run's attack seed.
        doc: the text's identifier (a row id), so each text gets its own draw.
    """
    return ATTACKS[name].apply(text, attack_rng(name, seed=seed, doc=doc))


def attack_rng(name: str, *, seed: int, doc: str) -> np.random.Generator:
    """The generator attack `name` draws from for text `doc` under the run's attack seed."""
    digest = hashlib.sha256(f"{name}\0{doc}\0{seed}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def attack_names() -> list[str]:
    """Every attack name and group name `parse_attacks` accepts."""
    return [*ATTACKS, *_GROUPS, "all"]


def parse_attacks(spec: str) -> list[str]:
    """Attack names from a comma-separated list of names and groups (char, word, span, model, all).

    "none" (the unattacked text) always comes first. "all" is char, word and span: the model
    attacks cost a generation each and are asked for by name or as "model".

    Raises:
        InputError: an unknown name.
    """
    names = ["none"]
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            expanded = [n for group in _CHEAP for n in _GROUPS[group]]
        elif part in _GROUPS:
            expanded = _GROUPS[part]
        elif part in ATTACKS:
            expanded = [part]
        else:
            raise InputError(f"unknown attack {part!r}; known: {', '.join(attack_names())}")
        names += [n for n in expanded if n not in names]
    return names
