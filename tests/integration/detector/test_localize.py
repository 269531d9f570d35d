"""The passage search: a 200-token watermarked passage inside 5,000 human tokens is found, the
same document without it is not, and the false-positive rate per document stays at alpha.

Human text is real (`system_corpus`: code, licences, package docs found on this machine). With
the WordLevel test tokenizer, real words are mapped onto its vocabulary w0..w499 (a fixed hash
of each word), which keeps the text's own repetition, and the planted passage round-trips
exactly as text. With the production Qwen tokenizer the planted IDs need not re-tokenise to
themselves, so that case works on token IDs. Keys have fixed secrets.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import Detector, TextTokenizer, key_pivots
from wmark.detector.localize import Localizer, window_family
from wmark.eval.corpus import system_corpus
from wmark.prf import KeyedSource
from wmark.scoring import log_gamma_sf

ALPHA = 0.01
N_HUMAN = 1000


def _word(word: str) -> str:
    return f"w{int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), 'big') % 500}"


@pytest.fixture(scope="module")
def corpus():
    return system_corpus(N_HUMAN)


@pytest.fixture(scope="module")
def human_words(corpus) -> list[str]:
    """About 6,000 real words, in order, mapped onto the test vocabulary."""
    words: list[str] = []
    for doc in corpus:
        words += [_word(w) for w in doc.text.split()]
        if len(words) > 6000:
            return words
    raise AssertionError("not enough human text on this machine")


def _passage(key, planted, seed: int, n: int = 200) -> list[str]:
    return [f"w{i - 1}" for i in planted(key, n, np.random.default_rng(seed))]


def test_watermarked_passage_in_5000_human_tokens_is_found_as_text(
    word_key, word_tokenizer_json, human_words, planted
):
    localizer = Localizer(Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json}))
    human = human_words[:5000]
    passage = _passage(word_key, planted, seed=11)
    at = 2600
    with_passage = " ".join(human[:at] + passage + human[at:])
    without = " ".join(human)

    found = localizer.localize(with_passage, alpha=ALPHA)
    assert found.verdict == "watermarked" and found.p_value < 1e-6 and found.key_id == word_key.key_id
    w = found.window
    assert w is not None and w.log_p < np.log(ALPHA)
    # the best window lies mostly inside the passage, in tokens and in characters
    overlap = min(w.end, at + 200) - max(w.start, at)
    assert overlap >= 0.6 * (w.end - w.start), (w.start, w.end)
    start_char = len(" ".join(human[:at])) + 1
    end_char = start_char + len(" ".join(passage))
    assert w.start_char is not None and w.end_char is not None
    assert min(w.end_char, end_char) - max(w.start_char, start_char) >= 0.6 * (w.end_char - w.start_char)
    assert with_passage[w.start_char : w.end_char].split() == with_passage.split()[w.start : w.end]

    clean = localizer.localize(without, alpha=ALPHA)
    assert clean.verdict == "not_detected" and clean.p_value > ALPHA
    assert clean.window is not None and clean.window.n_windows > 100  # the search did run


def test_the_whole_document_test_alone_misses_what_the_window_finds(
    word_key, word_tokenizer_json, human_words, planted
):
    # A short passage diluted in a long document: the whole-document p-value stays large, the
    # window's does not. This is what the window search is for.
    detector = Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})
    text = " ".join(human_words[:2500] + _passage(word_key, planted, seed=3, n=80) + human_words[2500:5000])
    found = Localizer(detector).localize(text, alpha=ALPHA)
    assert found.verdict == "watermarked"
    assert detector.detect(text, alpha=ALPHA).verdict == "not_detected"


@pytest.fixture(scope="module")
def qwen() -> tuple[TextTokenizer, bytes]:
    from wmark.generator.models.embedded import embedded_tokenizer_json

    data = embedded_tokenizer_json()
    return TextTokenizer(data, "qwen2.5-coder"), data


@pytest.fixture(scope="module")
def qwen_key(qwen) -> KeyMaterial:
    tok, _ = qwen
    secret = Secret(hashlib.sha256(b"wmark localize test key 0").digest())
    return KeyMaterial(key_id="wk_localize", secret=secret, spec=WatermarkSpec(tokenizer=tok.ref))


def test_watermarked_passage_in_5000_human_qwen_tokens_is_found(qwen, qwen_key, corpus, planted):
    tok, data = qwen
    localizer = Localizer(Detector([qwen_key], {tok.sha256: data}))
    human = np.concatenate(tok.encode_batch([d.text for d in corpus[:40]]))[:5000]
    assert len(human) == 5000
    passage = np.asarray(planted(qwen_key, 200, np.random.default_rng(5)), dtype=np.uint32)
    at = 1700
    found = localizer.localize(token_ids=np.concatenate([human[:at], passage, human[at:]]), alpha=ALPHA)
    assert found.verdict == "watermarked" and found.p_value < 1e-6
    w = found.window
    assert w is not None and min(w.end, at + 200) - max(w.start, at) >= 0.6 * (w.end - w.start)
    clean = localizer.localize(token_ids=human, alpha=ALPHA)
    assert clean.verdict == "not_detected"


def test_false_positive_rate_on_1000_human_documents_with_the_window_search(qwen, qwen_key, corpus):
    """Per-document FWER <= alpha: the flagged count is at most the top of Binomial(1000, 0.01)'s
    99% interval (Bonferroni is conservative, so only the upper end binds). The whole-document
    part alone is exactly calibrated, so its count must lie inside the interval's both ends."""
    tok, data = qwen
    results = Localizer(Detector([qwen_key], {tok.sha256: data})).localize_many(
        [d.text for d in corpus], alpha=ALPHA
    )
    assert len(results) == N_HUMAN and not any(isinstance(r, Exception) for r in results)
    lo, hi = stats.binom.interval(0.99, N_HUMAN, ALPHA)  # (3, 19)
    flagged = sum(r.verdict == "watermarked" for r in results)
    assert flagged <= hi, f"{flagged} of {N_HUMAN} human documents flagged; 99% interval [{lo}, {hi}]"
    whole = sum(np.exp(r.keys[0].whole_log_p) <= ALPHA for r in results)
    assert lo <= whole <= hi, f"whole-document test: {whole} below {ALPHA}; interval [{lo}, {hi}]"
    windows = sum(r.window is not None for r in results)
    assert windows > 0.9 * N_HUMAN  # the windows were searched in nearly every document


def test_false_positive_rate_on_random_text_at_alpha_005(word_key, word_tokenizer_json):
    """2,000 documents of i.i.d. words at alpha = 0.05: flagged <= top of the 99% interval of
    Binomial(2000, 0.05) (about 100 +- 26)."""
    rng = np.random.default_rng(2024)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 500, size=400)) for _ in range(2000)]
    localizer = Localizer(Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json}))
    flagged = sum(r.verdict == "watermarked" for r in localizer.localize_many(texts, alpha=0.05))
    assert flagged <= stats.binom.ppf(0.995, 2000, 0.05)


def test_whole_document_test_equals_the_detector_and_windows_equal_direct_sums(
    word_key, word_tokenizer_json, planted
):
    detector = Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})
    rng = np.random.default_rng(9)
    text = " ".join([f"w{i}" for i in rng.integers(0, 500, 700)] + _passage(word_key, planted, seed=4, n=90))
    found = Localizer(detector, min_window=16).localize(text)
    assert found.keys[0].whole_log_p == detector.detect(text).keys[0].log_p
    assert found.whole_p_value == detector.detect(text).p_value

    ids = detector.tokenizer(word_key.spec.tokenizer.sha256).encode(text)
    kp = key_pivots(ids, KeyedSource(word_key.secret, word_key.spec))
    starts, ends = window_family(len(kp.pivots), 16)
    direct = [
        log_gamma_sf(int(e - s), float(-np.log1p(-kp.pivots[s:e]).sum()))
        for s, e in zip(starts, ends, strict=True)
    ]
    best = int(np.argmin(direct))
    w = found.window
    assert w is not None and w.n_windows == len(starts)
    assert w.log_p_raw == pytest.approx(direct[best], rel=1e-9)
    assert (w.start, w.end) == (int(kp.positions[starts[best]]), int(kp.positions[ends[best] - 1]) + 1)
    assert w.log_p == pytest.approx(min(0.0, np.log(2 * len(starts)) + direct[best]), rel=1e-12)
    assert found.log_p == pytest.approx(min(0.0, np.log(2) + found.keys[0].whole_log_p, w.log_p), rel=1e-12)


def test_several_keys_report_the_one_that_marked_the_passage(
    word_spec, word_tokenizer_json, human_words, planted
):
    keys = [
        KeyMaterial(key_id=f"wk_multi{i}", secret=Secret(bytes([i]) * 32), spec=word_spec) for i in range(3)
    ]
    localizer = Localizer(Detector(keys, {word_spec.tokenizer.sha256: word_tokenizer_json}))
    text = " ".join(human_words[:3000] + _passage(keys[2], planted, seed=8) + human_words[3000:5000])
    found = localizer.localize(text)
    assert found.verdict == "watermarked" and found.key_id == "wk_multi2"
    assert [k.key_id for k in found.keys] == ["wk_multi0", "wk_multi1", "wk_multi2"]
    # Holm over three keys: the smallest combined p-value is multiplied by 3
    assert found.log_p == pytest.approx(min(0.0, np.log(3) + found.keys[2].log_p))


def test_short_documents_get_the_plain_whole_document_test(word_key, word_tokenizer_json):
    detector = Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json})
    text = " ".join(f"w{i}" for i in range(30))
    found = Localizer(detector).localize(text)
    assert found.window is None
    assert found.p_value == detector.detect(text).p_value
    assert Localizer(detector, min_window=0).localize(" ".join(f"w{i}" for i in range(400))).window is None


def test_failures_come_back_in_place_without_stopping_the_batch(word_key, word_tokenizer_json):
    from wmark.errors import InsufficientTextError

    localizer = Localizer(Detector([word_key], {word_key.spec.tokenizer.sha256: word_tokenizer_json}))
    out = localizer.localize_many(["w1 w2 w3 w4 w5 w6", "   ", "w7 w8"])
    assert isinstance(out[1], InsufficientTextError)
    assert not isinstance(out[0], Exception) and not isinstance(out[2], Exception)
