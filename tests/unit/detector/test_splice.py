"""Spliced canonical readings are token for token what tokenising the canonical text gives.

A small byte-level BPE tokenizer with Qwen2's pre-tokeniser is trained here (deterministic
trainer, fixed corpus); the texts are seeded random lines mixing what normalisation changes
(runs of spaces and tabs, trailing spaces, CR LF and other breaks, format characters,
look-alikes, combining marks) with what it keeps (indentation, blank lines, code, non-ASCII
text). Equality is exact: a single differing token ID fails.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from wmark.detector import Detector, TextTokenizer, splice
from wmark.detector.normalize import canonical_text
from wmark.detector.readings import reading_texts
from wmark.detector.splice import SpliceTables, canonical_readings

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WORDS = ["def", "return", "value", "the", "river", "It's", "x", "42", "(", "):", "#", "==", ".", ","]
SPACES = [" ", " ", " ", "  ", "   ", "\t", " \t", "\x1f"]
OTHERS = ["\u00e9", "e\u0301", "\u0430", "\u200b", "\u00a0", "\uff52", "\u4e2d\u6587", "\U0001f600", "\u0399"]
PIECES = [*WORDS, *SPACES, *OTHERS, "<|endoftext|>", "'s"]
LINE_ENDS = ["\n", "\n", "\n", "  \n", " \n", "\r\n", "\r", "\x0b", "\u2028", "\n\n", "\n   \n"]
INDENTS = ["", "", "    ", "\t", "        ", " "]


def _text(rng: np.random.Generator) -> str:
    lines = []
    for _ in range(int(rng.integers(1, 8))):
        words = [PIECES[int(i)] for i in rng.integers(0, len(PIECES), size=int(rng.integers(0, 10)))]
        indent = INDENTS[int(rng.integers(0, len(INDENTS)))]
        lines.append(indent + "".join(words) + LINE_ENDS[int(rng.integers(0, len(LINE_ENDS)))])
    text = "".join(lines)
    return text if rng.random() < 0.5 else text.rstrip("\n")  # with and without a final break


@pytest.fixture(scope="module")
def bpe() -> TextTokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    rng = np.random.default_rng(0)
    tok.train_from_iterator([_text(rng) for _ in range(400)], trainer)
    return TextTokenizer(tok.to_str().encode("utf-8"), "tiny-bpe")


def test_encode_gives_the_tokenizers_own_ids(bpe: TextTokenizer) -> None:
    """`TextTokenizer.encode` (the batch call without offsets, on one text) and `encode_batch`
    are `Tokenizer.encode(text).ids`, as uint32, special tokens in the text included."""
    raw = Tokenizer.from_str(bpe._json.decode("utf-8"))
    rng = np.random.default_rng(9)
    texts = [_text(rng) for _ in range(300)] + ["", " ", "<|endoftext|>x"]
    for text, batch in zip(texts, bpe.encode_batch(texts), strict=True):
        want = raw.encode(text, add_special_tokens=False).ids
        one = bpe.encode(text)
        assert one.dtype == batch.dtype == np.uint32
        assert one.tolist() == batch.tolist() == want


def test_spliced_readings_equal_tokenising_the_canonical_text(bpe: TextTokenizer) -> None:
    tables = bpe.splice_tables
    assert tables is not None
    rng = np.random.default_rng(1)
    texts = [t for t in (_text(rng) for _ in range(3000)) if t]
    readings = canonical_readings(tables, texts, bpe.encode_batch(texts), bpe.encode_batch)
    changed = 0
    for text, reading in zip(texts, readings, strict=True):
        canonical = canonical_text(text)
        if reading is None:
            assert canonical == text, repr(text)
            continue
        changed += 1
        assert reading[0] == canonical, repr(text)
        assert np.array_equal(reading[1], bpe.encode(canonical)), repr(text)
    assert 0.2 * len(texts) < changed < len(texts)  # both kinds are exercised


def test_the_c_scan_finds_the_chunks_of_the_numpy_rule(bpe: TextTokenizer) -> None:
    """`_changed_chunks` and `_changed_spans` (C) equal `_changed_chunks_reference` (numpy) and
    `_changed_spans_reference`, on real texts' tokens and on random token sequences drawn mostly
    from the tokens the rules look at (spaces, breaks)."""
    tables = bpe.splice_tables
    assert tables is not None and splice._fastsplice is not None
    rng = np.random.default_rng(5)
    texts = [_text(rng) for _ in range(2000)]
    batches = [bpe.encode_batch(texts)]
    vocab = np.arange(len(tables.byte_len), dtype=np.uint32)
    spacey = vocab[
        tables.blank | tables.ends_line | tables.starts_run | tables.opens_line | tables.closes_line
    ]
    for _ in range(20):
        lengths = rng.integers(0, 40, size=100)
        lengths[rng.random(100) < 0.1] = 0  # empty texts among the others
        pools = [spacey if rng.random() < 0.7 else vocab for _ in range(int(lengths.sum()))]
        flat = np.array([rng.choice(pool) for pool in pools], dtype=np.uint32)
        batches.append(np.split(flat, np.cumsum(lengths)[:-1]))
    found = 0
    for ids in batches:
        want = splice._changed_chunks_reference(tables, ids)
        assert splice._changed_chunks(tables, ids) == want
        assert [splice._changed_chunks(tables, [x])[0] for x in ids[:300]] == want[:300]  # one at a time
        want_spans = splice._changed_spans_reference(tables, ids)
        assert [[s[:2] for s in spans] for spans in want_spans[0]] == want
        assert splice._changed_spans(tables, ids) == want_spans
        for i, x in enumerate(ids[:300]):
            assert splice._changed_spans(tables, [x]) == ([want_spans[0][i]], [want_spans[1][i]])
        found += sum(map(len, want))
    assert found > 1000  # the rules fire
    assert splice._changed_spans(tables, []) == ([], [])
    for scan in (splice._changed_chunks, splice._changed_spans):
        with pytest.raises(IndexError, match="outside the splice tables"):
            scan(tables, [np.array([len(vocab)], dtype=np.uint32)])


def test_the_detector_reads_the_same_token_ids_as_full_tokenisation(bpe: TextTokenizer) -> None:
    from wmark import KeyMaterial, Secret, WatermarkSpec

    key = KeyMaterial(key_id="wk_splice", secret=Secret(bytes(32)), spec=WatermarkSpec(tokenizer=bpe.ref))
    data = bpe._json
    detector = Detector([key], {bpe.sha256: data})
    rng = np.random.default_rng(2)
    texts = [t for t in (_text(rng) for _ in range(500)) if t.strip()]
    texts += ["THE RIVER FLOODS.  IT RISES. I SEE IT NOW.\n", "The River Floods In Spring  \n"]
    # re-wrapped (with and without doubled spaces or a mark), and recased with a mark
    paragraph = " ".join(["the river x value return"] * 12)
    wrapped = "\n".join(textwrap.wrap(paragraph, 40))
    texts += [wrapped, wrapped.replace(" ", "  ", 3), wrapped.replace(" ", "\u00a0", 2)]
    texts += ["THE RIVER\u200b FLOODS. IT RISES. I SEE IT NOW.\n"]
    for text, enc in zip(texts, detector.encode_many(texts), strict=True):
        want: list[np.ndarray] = []
        for reading in reading_texts(text, bpe.case_forms):
            ids = bpe.encode(reading)
            if all(not np.array_equal(ids, seen) for seen in want):
                want.append(ids)
        got = [e.ids for e in enc.readings(key)]
        single = [e.ids for e in detector.encode(text).readings(key)]
        assert len(got) == len(want) == len(single), repr(text)
        for a, b, c in zip(got, want, single, strict=True):
            assert np.array_equal(a, b) and np.array_equal(c, b), repr(text)


def test_other_tokenizers_are_not_spliced(word_tokenizer_json: bytes, bpe: TextTokenizer) -> None:
    assert SpliceTables.from_json(word_tokenizer_json) is None
    config = json.loads(bpe._json)
    config["normalizer"] = {"type": "NFC"}
    assert SpliceTables.from_json(json.dumps(config).encode()) is None
    config = json.loads(bpe._json)
    config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    assert SpliceTables.from_json(json.dumps(config).encode()) is None


BLANKS = [" ", "  ", "\t", " \t ", "    ", " " * 20, "\t" * 9, "\u00a0", " \u3000", "\u200b ", "\x1f", ""]
BREAKS = ["\n", "\n", "\r\n", " \r\n", "  \n", "\r"]


def _blank_lines_text(rng: np.random.Generator) -> str:
    """Lines of text and lines of spaces only (ASCII, compatibility, invisible; long runs that
    take several tokens), on LF, CR LF and trailing spaces, at the start and end of the text."""
    lines = []
    for _ in range(int(rng.integers(1, 8))):
        if rng.random() < 0.5:
            line = "".join(BLANKS[int(i)] for i in rng.integers(0, len(BLANKS), size=int(rng.integers(1, 3))))
        else:
            words = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(1, 5)))]
            line = INDENTS[int(rng.integers(0, len(INDENTS)))] + " ".join(words)
        lines.append(line + BREAKS[int(rng.integers(0, len(BREAKS)))])
    text = "".join(lines)
    return text if rng.random() < 0.5 else text.rstrip("\r\n")


BLANK_CASES = [
    "a\n   \nb",
    "a\n\t\nb",
    "a\r\n \r\nb",
    "a\n\u00a0\nb",
    "   \nb",
    "a\n   ",
    "a\n\n   ",
    "   ",
    "a\n" + " " * 40 + "\nb",
    "a\n" + " " * 40,
    " " * 40 + "\nb",
    "a\n \n \n \nb",
    "a\n\n \n\nb",
    "def f(x):\n    y = x\n    \n    return y\n",
    "x  \n \t \n  y \n",
    "a\n \t\n\tb",
    "a\n\x1f\nb",
]
# every length of run, so that the vocabulary splits some before a token that starts with "\n"
BLANK_CASES += [
    f"a\n{run * k}{end}b" for run in (" ", "\t", " \t") for k in range(1, 25) for end in ("\n", "\n\n")
]


def test_lines_of_spaces_only_splice_like_full_tokenisation(bpe: TextTokenizer) -> None:
    """A line of spaces only becomes empty in the canonical reading, inside one token ("\\n   \\n"),
    across several (a long run), at the text's start or end: the spliced tokens are still those
    of the canonical text."""
    tables = bpe.splice_tables
    assert tables is not None
    rng = np.random.default_rng(3)
    texts = BLANK_CASES + [t for t in (_blank_lines_text(rng) for _ in range(3000)) if t]
    readings = canonical_readings(tables, texts, bpe.encode_batch(texts), bpe.encode_batch)
    emptied = 0
    for text, reading in zip(texts, readings, strict=True):
        canonical = canonical_text(text)
        if reading is None:
            assert canonical == text, repr(text)
            continue
        emptied += canonical.count("\n\n") > text.replace("\r\n", "\n").count("\n\n")
        assert reading[0] == canonical, repr(text)
        assert np.array_equal(reading[1], bpe.encode(canonical)), repr(text)
    assert emptied > 0.3 * len(texts)


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("\n\n", "\n   \n"),
        lambda t: t.replace("\n\n", "\n\t\n"),
        lambda t: t.replace("\n\n", "\n\u00a0\n"),
        lambda t: t.replace("\n", " \r\n"),
    ],
)
def test_blank_lines_given_spaces_read_as_the_answers_own_tokens(
    bpe: TextTokenizer, edit: Callable[[str], str]
) -> None:
    answer = "The river floods.\n\n```\ndef f(x):\n    return x\n\n    # done\n```\n\nIt's 42.\n"
    edited = edit(answer)
    assert not np.array_equal(bpe.encode(edited), bpe.encode(answer))
    tables = bpe.splice_tables
    assert tables is not None
    (reading,) = canonical_readings(tables, [edited], bpe.encode_batch([edited]), bpe.encode_batch)
    assert reading is not None and reading[0] == answer
    assert np.array_equal(reading[1], bpe.encode(answer))
