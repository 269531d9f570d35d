"""Detection end to end on token IDs and text: planted watermarks are found, others are not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wmark import InputError, InsufficientTextError, KeyMaterial, Secret, TokenizerError
from wmark.detector import Detector, detect, holm_adjust


def test_planted_watermark_is_detected_at_200_tokens(word_key, planted):
    rng = np.random.default_rng(10)
    ids = planted(word_key, 200, rng)
    result = detect(token_ids=ids, keys=[word_key])
    assert result.verdict == "watermarked"
    assert result.p_value < 1e-6
    assert result.key_id == word_key.key_id
    assert result.n_tokens == 200 and 150 <= result.n_scored <= 196


def test_wrong_key_does_not_detect(word_key, planted):
    rng = np.random.default_rng(11)
    ids = planted(word_key, 300, rng)
    other = KeyMaterial(key_id="wk_other", secret=Secret(b"\x01" * 32), spec=word_key.spec)
    result = detect(token_ids=ids, keys=[other])
    assert result.verdict == "not_detected"
    assert result.p_value > 1e-3  # H0: a draw from Unif(0,1); 1e-3 fails for 1 seed in 1000


def test_text_round_trip_through_the_tokenizer(word_key, word_tokenizer_json, planted):
    rng = np.random.default_rng(12)
    ids = planted(word_key, 250, rng)
    text = " ".join(f"w{i - 1}" for i in ids)  # WordLevel: id i is the word w{i-1}
    detector = Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})
    result = detector.detect(text, return_tokens=True)
    assert result.verdict == "watermarked"
    assert result.tokens is not None and len(result.tokens) == 250
    first = result.tokens[10]
    assert text[first.start : first.end] == f"w{ids[10] - 1}"
    scored = [t for t in result.tokens if t.pivot is not None]
    assert len(scored) == result.n_scored
    assert math.isclose(sum(t.score for t in scored), result.score, rel_tol=1e-12)


def test_multiple_keys_holm_correction_and_matched_key(word_key, planted):
    rng = np.random.default_rng(13)
    ids = planted(word_key, 200, rng)
    others = [
        KeyMaterial(key_id=f"wk_o{i}", secret=Secret(bytes([i + 2]) * 32), spec=word_key.spec)
        for i in range(9)
    ]
    result = detect(token_ids=ids, keys=[*others, word_key])
    assert result.verdict == "watermarked" and result.key_id == word_key.key_id
    single = next(k for k in result.keys if k.key_id == word_key.key_id)
    assert math.isclose(result.log_p, min(0.0, single.log_p + math.log(10)), rel_tol=1e-12)
    assert len(result.keys) == 10


def test_holm_adjustment_matches_the_textbook_procedure():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005=0.02, 3*0.01=0.03, 2*0.03=0.06, max(0.06, 0.04)=0.06
    expected = [0.03, 0.06, 0.06, 0.02]
    assert np.allclose(np.exp(holm_adjust([math.log(x) for x in p])), expected)


def test_short_text_is_insufficient_evidence(word_key, planted):
    ids = planted(word_key, 12, np.random.default_rng(14))
    assert detect(token_ids=ids, keys=[word_key]).verdict == "insufficient_evidence"


def test_bad_inputs_are_clear_errors(word_key, word_tokenizer_json):
    tokenizers = {word_key.spec.tokenizer.sha256: word_tokenizer_json}
    detector = Detector([word_key], tokenizers)
    with pytest.raises(InsufficientTextError):
        detector.detect("   ")
    with pytest.raises(InsufficientTextError):
        detector.detect(token_ids=[])
    with pytest.raises(TokenizerError, match="vocabulary"):
        detector.detect(token_ids=[1, 2, 10_000])
    with pytest.raises(InputError):
        detector.detect(token_ids=[[1, 2]])
    with pytest.raises(InputError):
        detector.detect("w1 w2", token_ids=[1, 2])
    with pytest.raises(InputError, match="alpha"):
        detector.detect("w1 w2", alpha=1.5)
    with pytest.raises(TokenizerError, match="not in the registry"):
        Detector([word_key], {}).detect("w1 w2")
    with pytest.raises(InputError, match="no keys"):
        Detector([], tokenizers)
    # a JSON "\ud800" escape gives a str no tokenizer takes: bad input, not a TypeError
    with pytest.raises(InputError, match="unpaired surrogate at character 3"):
        detector.detect("w1 \ud800 w2")
    with pytest.raises(InputError, match="unpaired surrogate"):
        detector.detect_many(["w1 w2", "w1 \ud800"])


def test_localize_many_gives_a_bad_text_its_own_error(word_key, word_tokenizer_json, planted):
    from wmark.detector.localize import Localizer

    detector = Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})
    ids = planted(word_key, 200, np.random.default_rng(3))
    marked = " ".join(f"w{i - 1}" for i in ids)  # WordLevel: id i is the word w{i-1}
    out = Localizer(detector).localize_many([marked, "w1 \ud800", "  ", marked])
    assert [type(o).__name__ for o in out] == [
        "Localization",
        "InputError",
        "InsufficientTextError",
        "Localization",
    ]
    assert out[0].verdict == out[3].verdict == "watermarked"


def test_prompt_aware_detection_scores_the_first_positions(word_key, planted):
    rng = np.random.default_rng(15)
    ids = planted(word_key, 100, rng)
    answer_only = detect(token_ids=ids, keys=[word_key])
    with_prompt = detect(token_ids=[7, 8, 9, 10, *ids], keys=[word_key], start=4)
    assert with_prompt.n_scored >= answer_only.n_scored
