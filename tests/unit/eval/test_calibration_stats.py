"""The statistics of `wmark calibrate`: exact rates, the one-sided uniformity test (which passes a
valid conservative test and fails an anti-conservative one), length buckets, the QQ files, and
the corpus screening (copies, near copies, the order-free corpus digest)."""

from __future__ import annotations

import csv
import hashlib
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from wmark import KeyMaterial, Secret
from wmark.errors import InputError
from wmark.eval.calibrate import CorpusText, calibrate
from wmark.eval.calibration_stats import bucket_edges, buckets, rate, uniformity
from wmark.eval.qq import qq_points, write_qq


def test_rate_has_the_exact_interval_and_allows_a_conservative_count():
    r = rate(20, 2000, alpha=0.01, confidence=0.99)
    assert (r.expected_low, r.expected_high) == (10, 32) and r.within
    ci = stats.binomtest(20, 2000).proportion_ci(confidence_level=0.99, method="exact")
    assert (r.ci_low, r.ci_high) == (ci.low, ci.high) and r.rate == 0.01
    assert rate(33, 2000, alpha=0.01, confidence=0.99).within is False  # above what alpha allows
    assert rate(0, 2000, alpha=0.01, confidence=0.99).within is True  # conservative: allowed
    empty = rate(0, 0, alpha=0.01, confidence=0.99)
    assert empty.to_dict()["rate"] is None and empty.within


def test_the_one_sided_ks_test_passes_valid_conservative_p_values_and_fails_small_ones():
    u = np.random.default_rng(7).random(3000)
    assert uniformity(u).p_value > 0.01
    bonferroni = np.minimum(1.0, 2.0 * u)  # what two readings of a text give: valid, conservative
    assert uniformity(bonferroni).p_value > 0.5 and uniformity(bonferroni).at_one == pytest.approx(
        0.5, abs=0.03
    )
    assert stats.kstest(bonferroni, "uniform").pvalue < 1e-10  # a two-sided test would reject it
    assert uniformity(u**1.3).p_value < 1e-6  # p-values too small: rejected
    assert math.isnan(uniformity([]).p_value)


def test_length_buckets_start_at_the_keys_minimum_and_partition_the_documents():
    assert bucket_edges(16) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert bucket_edges(100) == [100, 128, 256, 512, 1024, 2048]
    n = np.array([16, 31, 32, 500, 5000], dtype=np.int64)
    flagged = np.array([True, False, False, True, False])
    found = buckets(n, flagged, min_scored_tokens=16, alpha=0.01, confidence=0.99)
    assert [(b.low, b.high, b.rate.scored, b.rate.flagged) for b in found] == [
        (16, 32, 2, 1),
        (32, 64, 1, 0),
        (256, 512, 1, 1),
        (2048, None, 1, 0),
    ]


def test_qq_files_and_their_band(tmp_path: Path):
    p = np.random.default_rng(3).random(500)
    expected, observed, low, high = qq_points(p, confidence=0.99)
    assert np.all(np.diff(observed) >= 0) and np.all(low <= expected) and np.all(expected <= high)
    assert np.mean((observed < low) | (observed > high)) < 0.05  # pointwise 99% band
    write_qq(tmp_path / "qq.csv", p, title="k", confidence=0.99)
    rows = list(csv.DictReader((tmp_path / "qq.csv").read_text().splitlines()))
    assert len(rows) == 500 and rows[0]["rank"] == "1"
    write_qq(tmp_path / "qq.svg", np.append(p, 0.0), title="k <&>", confidence=0.99)  # an underflowed p too
    svg = ET.parse(tmp_path / "qq.svg").getroot()
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}circle")) == 501
    with pytest.raises(InputError, match=r"\.csv table or an \.svg figure"):
        write_qq(tmp_path / "qq.png", p, title="k", confidence=0.99)
    with pytest.raises(InputError, match="nothing to plot"):
        write_qq(tmp_path / "qq.svg", [], title="k", confidence=0.99)


def test_screening_counts_every_document_and_the_corpus_digest_ignores_order(word_spec, word_tokenizer_json):
    key = KeyMaterial(key_id="k", secret=Secret(hashlib.sha256(b"unit").digest()), spec=word_spec)
    rng = np.random.default_rng(5)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, 500, size=80)) for _ in range(30)]
    corpus = [CorpusText(f"d{i}", t) for i, t in enumerate(docs)]
    corpus += [
        CorpusText("copy", docs[0]),
        CorpusText("unreadable", None, "cannot read"),
        CorpusText("surrogate", "w1 \ud800 w2"),
        CorpusText("blank", " \n"),
        CorpusText("long", "w1 " * 200),
        CorpusText("one", "w3"),
    ]
    run = calibrate(corpus, [key], {word_spec.tokenizer.sha256: word_tokenizer_json}, max_chars=500)
    report = run.reports[0]
    c = report.corpus
    assert (c.read, c.duplicates, c.unreadable, c.empty, c.too_long, c.distinct) == (36, 1, 2, 1, 1, 31)
    assert report.too_short == 1 and report.fpr.scored == 30 and len(run.p_values["k"]) == 30
    again = calibrate(list(reversed(corpus)), [key], {word_spec.tokenizer.sha256: word_tokenizer_json})
    assert again.reports[0].corpus_sha256 == report.corpus_sha256
    with pytest.raises(InputError, match="alpha"):
        calibrate(corpus, [key], {}, alpha=1.0)
