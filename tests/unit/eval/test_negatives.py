"""A negative corpus: how it is read (and refused when too small to resolve 1 %), and the
thresholds calibrated on it, checked against the documents' p-values recomputed by the detector."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from wmark.detector import Detector, TextTokenizer
from wmark.errors import InputError
from wmark.eval.negatives import MIN_NEGATIVES, calibrate_negatives, read_negatives


def _docs(rng: np.random.Generator, n: int, words: int) -> list[str]:
    return [" ".join(f"w{i}" for i in rng.integers(0, 200, size=words)) for _ in range(n)]


def test_read_negatives_formats_and_refusals(tmp_path: Path) -> None:
    docs = [f"document {i}" for i in range(MIN_NEGATIVES)]
    jsonl = tmp_path / "neg.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"text": d}) if i % 2 else json.dumps(d) for i, d in enumerate(docs))
    )
    assert read_negatives(jsonl) == docs
    text = tmp_path / "neg.txt"
    text.write_text("\n\n".join(docs) + "\n")  # blank lines are not documents
    assert read_negatives(text) == docs
    text.write_text("\n".join(docs[:-1]))
    with pytest.raises(InputError, match=r"99 documents; .* at least 100 .* steps of 1/n"):
        read_negatives(text)
    jsonl.write_text('{"text": "a"}\n{"body": 1}\n')
    with pytest.raises(InputError, match="line 2"):
        read_negatives(jsonl)
    with pytest.raises(InputError, match="cannot read"):
        read_negatives(tmp_path / "missing.txt")


def test_thresholds_are_the_second_smallest_p_value_of_the_long_enough_documents(
    word_key, word_tokenizer_json
):
    rng = np.random.default_rng(5)
    # 150 documents of 40 words and 99 of 12: at T = 8 all 249 count (k = floor(0.01 * 249) = 2),
    # at T = 32 the 150 long ones (k = 1), and at T = 64 none (no threshold).
    docs = _docs(rng, 150, 40) + _docs(rng, 99, 12)
    found = calibrate_negatives(
        docs, key=word_key, tokenizer_json=word_tokenizer_json, lengths=[32, 8, 64], source="x"
    )
    assert found.documents == 249 and found.counts == {8: 249, 32: 150, 64: 0}
    assert math.isnan(found.token_level[64]) and math.isnan(found.text_level[64])
    tokenizer = TextTokenizer(word_tokenizer_json, "words")
    detector = Detector([word_key], {tokenizer.sha256: word_tokenizer_json})
    for t, k in ((8, 2), (32, 1)):
        cut = [tokenizer.encode(d)[:t] for d in docs if len(tokenizer.encode(d)) >= t]
        by_ids = sorted(detector.detect(token_ids=ids).log_p for ids in cut)
        by_text = sorted(detector.detect(tokenizer.decode(ids.tolist())).log_p for ids in cut)
        assert found.token_level[t] == pytest.approx(by_ids[k], rel=1e-12)
        assert found.text_level[t] == pytest.approx(by_text[k], rel=1e-12)
        # at most k of the negatives are flagged (strictly below): the empirical FPR is <= 1 %
        assert sum(lp < found.token_level[t] for lp in by_ids) <= k


def test_a_key_for_another_tokenizer_is_refused(word_key) -> None:
    from tests.conftest import build_word_tokenizer

    with pytest.raises(InputError, match="not the run key's"):
        calibrate_negatives(
            ["w1 w2"] * 100, key=word_key, tokenizer_json=build_word_tokenizer(50), lengths=[8], source="x"
        )
