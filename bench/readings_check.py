"""Check: the detector's spliced readings are bit-identical to tokenising every reading in full.

    .venv/bin/python bench/readings_check.py [--docs 2000] [--attacked 200]

For the human corpus (`system_corpus`) and, for the first `--attacked` of its documents, every
character-level attack of `wmark.eval.attacks` (zero-width, homoglyphs, fullwidth, spacing, line
ends, Unicode forms, case), it compares `Detector.detect_many` (readings spliced where the
tokenizer allows: `wmark.detector.splice`) with the reference: each text of `reading_texts`
tokenised in full (unwrapped and recased readings included), the same Bonferroni rule over the
distinct readings. Token IDs of every reading and every key's log p-value must be equal (not
close): exits 1 on the first difference.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys

import numpy as np

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import Detector, TextTokenizer
from wmark.detector.readings import reading_texts
from wmark.eval.attacks import ATTACKS
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json


def _reference_ids(tok: TextTokenizer, text: str) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for reading in reading_texts(text, tok.case_forms):
        ids = tok.encode(reading)
        if all(not np.array_equal(ids, seen) for seen in out):
            out.append(ids)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--attacked", type=int, default=200)
    args = parser.parse_args()

    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    if tok.splice_tables is None:
        sys.exit("the embedded tokenizer is not spliced: nothing to check")
    key = KeyMaterial(
        key_id="wk_check",
        secret=Secret(hashlib.sha256(b"check").digest()),
        spec=WatermarkSpec(tokenizer=tok.ref),
    )
    detector = Detector([key], {tok.sha256: data})
    reference = Detector([key], {tok.sha256: data}, normalize=False)
    scorer = reference.scorers[key.key_id]

    human = [d.text for d in system_corpus(args.docs)]
    texts = list(human)
    rng = np.random.default_rng(0)
    for attack in (a for a in ATTACKS.values() if a.level == "char"):
        texts += [attack.apply(t, rng) for t in human[: args.attacked]]
    texts = [t for t in texts if t.strip()]

    spliced = changed = 0
    for text, encodings, found in zip(
        texts, detector.encode_many(texts), detector.detect_many(texts), strict=True
    ):
        got = [e.ids for e in encodings.readings(key)]
        want = _reference_ids(tok, text)
        if len(got) != len(want) or not all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)):
            sys.exit(f"token IDs differ for {text[:60]!r}")
        best = min(scorer.test(scorer.pivots(ids)).log_p for ids in want)
        log_p = min(0.0, best + math.log(len(want))) if len(want) > 1 else best
        if found.keys[0].log_p != log_p:
            sys.exit(f"log p differs for {text[:60]!r}: {found.keys[0].log_p} != {log_p}")
        spliced += len(want) > 1
        changed += len(want) == 1 and not np.array_equal(want[0], tok.encode(text))
    print(
        f"{len(texts)} texts ({len(human)} human, the rest attacked), "
        f"{spliced} with two readings, {changed} read otherwise than as submitted: identical"
    )


if __name__ == "__main__":
    main()
