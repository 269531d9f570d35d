"""Edits a reader cannot see do not hide a watermark, and the evidence lands on the submitted text.

The WordLevel test tokenizer reads w0..w499; an attacked word ("ԝ12" with a Cyrillic we, or a
zero-width space in front) is unknown to it, so the raw text loses the watermark while its
canonical reading is exactly the clean text. Keys have fixed secrets; planted texts are seeded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from wmark.detector import Detector
from wmark.detector.localize import Localizer
from wmark.detector.normalize import normalize

CYRILLIC_WE = "\u051d"  # a look-alike of "w" (Unicode confusables)


def _attacked(words: list[str]) -> str:
    """Every other word gets a Cyrillic "w", every space a zero-width space after it, CR LF ends."""
    out = [w.replace("w", CYRILLIC_WE) if i % 2 else w for i, w in enumerate(words)]
    lines = [" \u200b".join(out[i : i + 20]) for i in range(0, len(out), 20)]
    return "\r\n".join(lines)


@pytest.fixture()
def detector(word_key, word_tokenizer_json) -> Detector:
    return Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})


@pytest.fixture()
def raw_detector(word_key, word_tokenizer_json) -> Detector:
    """The same key, reading the text only as submitted."""
    return Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json}, normalize=False)


@pytest.fixture()
def planted_words(word_key, planted) -> list[str]:
    return [f"w{i - 1}" for i in planted(word_key, 200, np.random.default_rng(31))]


def test_invisible_edits_cost_the_watermark_nothing(detector, raw_detector, planted_words):
    attacked = _attacked(planted_words)
    clean = normalize(attacked).text
    assert clean.split() == planted_words  # the canonical reading is the clean text

    raw_only = raw_detector.detect(attacked)
    assert raw_only.verdict != "watermarked"  # the attack works on a detector that reads raw text

    result = detector.detect(attacked)
    reference = detector.detect(clean)
    assert reference.verdict == "watermarked" and reference.p_value < 1e-6
    assert result.verdict == "watermarked"
    # the marks (zero-width spaces, a look-alike, CR) decide the reading: the canonical one
    # alone, so no correction: exactly the clean text's p-value
    assert math.isclose(result.log_p, reference.log_p, rel_tol=1e-12)


def test_unchanged_text_pays_no_correction(detector, raw_detector, planted_words):
    text = " ".join(planted_words)
    assert math.isclose(detector.detect(text).log_p, raw_detector.detect(text).log_p, rel_tol=1e-12)


def test_token_evidence_points_at_the_characters_of_the_attacked_text(detector, planted_words):
    attacked = _attacked(planted_words)
    result = detector.detect(attacked, return_tokens=True)
    assert result.tokens is not None and len(result.tokens) == len(planted_words)
    for token, word in zip(result.tokens, planted_words, strict=True):
        assert token.start is not None and token.end is not None
        shown = attacked[token.start : token.end]
        assert normalize(shown).text == word  # the span shows the attacked word itself
    scored = [t for t in result.tokens if t.score is not None]
    assert math.isclose(sum(t.score for t in scored), result.score, rel_tol=1e-12)


def test_window_search_reports_characters_of_the_attacked_text(detector, planted_words):
    filler = [f"w{(7 * i) % 500}" for i in range(300)]
    attacked = " ".join(filler) + " " + _attacked(planted_words) + " " + " ".join(filler)
    found = Localizer(detector).localize(attacked)
    assert found.verdict == "watermarked" and found.window is not None
    start, end = found.window.start_char, found.window.end_char
    assert start is not None and end is not None
    inside = normalize(attacked[start:end]).text.split()
    # the window lies inside the planted passage, which starts after the filler
    assert len(inside) >= 32
    assert " ".join(inside) in " ".join(planted_words)
