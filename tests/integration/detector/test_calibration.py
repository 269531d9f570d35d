"""Calibration on real human text with the production tokenizer, and a planted watermark.

Under H0 each document's p-value is uniform, so over n documents the count with p < 0.01 is
Binomial(n, 0.01): it must lie in that distribution's 99% interval. The corpus is text this
project did not write (standard-library code, licences, package docs, changelogs), with its
repetition left in. The key's secret is fixed (seeded) so the test is reproducible.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import Detector, TextTokenizer
from wmark.eval.corpus import system_corpus

N_DOCS = 2000


@pytest.fixture(scope="module")
def embedded_tokenizer() -> TextTokenizer:
    from wmark.generator.models.embedded import embedded_tokenizer_json

    return TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")


@pytest.fixture(scope="module")
def calibration_key(embedded_tokenizer: TextTokenizer) -> KeyMaterial:
    spec = WatermarkSpec(tokenizer=embedded_tokenizer.ref)
    secret = Secret(hashlib.sha256(b"wmark calibration test key 0").digest())
    return KeyMaterial(key_id="wk_calibration", secret=secret, spec=spec)


def test_false_positive_rate_on_2000_human_documents(embedded_tokenizer, calibration_key):
    docs = system_corpus(N_DOCS)
    assert len(docs) == N_DOCS, f"only {len(docs)} human documents found on this machine"
    kinds = {d.kind for d in docs}
    assert {"code", "licence", "prose"} <= kinds
    tokenizers = {embedded_tokenizer.sha256: embedded_tokenizer_bytes(embedded_tokenizer)}
    detector = Detector([calibration_key], tokenizers)
    results = detector.detect_many([d.text for d in docs], alpha=0.01)
    p = np.array([r.p_value for r in results])
    lo, hi = stats.binom.interval(0.99, N_DOCS, 0.01)
    flagged = int(np.sum(p < 0.01))
    assert lo <= flagged <= hi, f"{flagged} of {N_DOCS} below 0.01; 99% interval [{lo}, {hi}]"
    assert p.min() >= 1e-6, f"a human document reached p = {p.min():.2e}"
    assert sum(r.n_scored for r in results) > 500_000  # the documents are long enough to mean something


def embedded_tokenizer_bytes(tok: TextTokenizer) -> bytes:
    from wmark.generator.models.embedded import embedded_tokenizer_json

    data = embedded_tokenizer_json()
    assert hashlib.sha256(data).hexdigest() == tok.sha256
    return data


def test_planted_watermark_in_the_production_vocabulary(calibration_key, planted):
    rng = np.random.default_rng(20)
    for _ in range(5):
        ids = planted(calibration_key, 200, rng)
        result = Detector([calibration_key]).detect(token_ids=ids)
        assert result.verdict == "watermarked" and result.p_value < 1e-6


def test_attacks_on_human_text_create_no_detection(embedded_tokenizer, calibration_key):
    """Every character-level attack, one per document in turn, on 2,000 human documents: the
    count of p < 0.01 stays in the same binomial interval (the readings' Bonferroni factor keeps
    each document's p-value valid), and no document comes near a detection at 1e-6."""
    from wmark.eval.attacks import ATTACKS, attacked

    names = [a.name for a in ATTACKS.values() if a.level == "char"]
    docs = system_corpus(N_DOCS)
    texts = [attacked(names[i % len(names)], d.text, seed=0, doc=d.source) for i, d in enumerate(docs)]
    tokenizers = {embedded_tokenizer.sha256: embedded_tokenizer_bytes(embedded_tokenizer)}
    results = Detector([calibration_key], tokenizers).detect_many(texts, alpha=0.01)
    p = np.array([r.p_value for r in results])
    lo, hi = stats.binom.interval(0.99, N_DOCS, 0.01)
    flagged = int(np.sum(p < 0.01))
    assert lo <= flagged <= hi, f"{flagged} of {N_DOCS} below 0.01; 99% interval [{lo}, {hi}]"
    assert p.min() >= 1e-6, f"an attacked human document reached p = {p.min():.2e}"
