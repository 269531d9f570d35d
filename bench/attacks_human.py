"""False positives under attack: every character- and word-level attack applied to N human documents.

    .venv/bin/python bench/attacks_human.py [--docs 2000]

The documents are `wmark.eval.corpus.system_corpus` (human text found on this machine); the key
is the calibration key of tests/integration/detector/test_calibration.py. For each attack the
table shows how many documents have p < 0.01 (the 99% binomial interval of Binomial(N, 0.01)
beside it) and the smallest p-value: an attack must never make human text look watermarked.
"""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
from scipy import stats

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import Detector, TextTokenizer
from wmark.eval.attacks import ATTACKS, attacked
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    args = parser.parse_args()
    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    secret = Secret(hashlib.sha256(b"wmark calibration test key 0").digest())
    key = KeyMaterial(key_id="wk_calibration", secret=secret, spec=WatermarkSpec(tokenizer=tok.ref))
    detector = Detector([key], {tok.sha256: data})
    docs = system_corpus(args.docs)
    lo, hi = stats.binom.interval(0.99, len(docs), 0.01)
    print(f"{len(docs)} human documents, alpha 0.01, 99% binomial interval [{lo:.0f}, {hi:.0f}]\n")
    print("| attack | p < 0.01 | in the interval | min p |")
    print("|---|---:|---|---:|")
    names = [a.name for a in ATTACKS.values() if a.level in ("none", "char", "word")]
    for name in names:
        texts = [attacked(name, d.text, seed=0, doc=d.source) for d in docs]
        p = np.array([r.p_value for r in detector.detect_many(texts)])
        flagged = int((p < 0.01).sum())
        inside = "yes" if lo <= flagged <= hi else "NO"
        print(f"| {name} | {flagged} | {inside} | {p.min():.1e} |", flush=True)


if __name__ == "__main__":
    main()
