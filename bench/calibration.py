"""False-positive calibration across many keys on human text found on this machine.

    WMARK_MODEL_CACHE=... .venv/bin/python bench/calibration.py [--docs 2000] [--keys 40]

For each of K seeded keys, counts the documents with p < 0.01 among N human-written documents
(standard-library code, licences, package docs, changelogs; `wmark.eval.corpus`), with and
without dropping near-copies across documents. Under H0 each count is Binomial(N, 0.01) *if the
documents are independent*; the table shows the mean, the variance against the binomial
variance, how many keys fall outside the 99% binomial interval, and the smallest p-value seen.
"""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
from scipy import stats

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import Detector, TextTokenizer
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=40)
    args = parser.parse_args()
    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    spec = WatermarkSpec(tokenizer=tok.ref)
    lo, hi = stats.binom.interval(0.99, args.docs, 0.01)
    print(
        f"{args.docs} documents per corpus, {args.keys} keys, alpha 0.01; "
        f"99% binomial interval [{lo:.0f}, {hi:.0f}]"
    )
    print()
    print(
        "| corpus | tokens | flagged per key: mean | variance (binomial) | keys outside the 99% interval | "
        "min p over all keys |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for label, max_shared in (
        ("near-copies across documents dropped (default)", 0.5),
        ("near-copies kept", 1.0),
    ):
        docs = system_corpus(args.docs, max_shared=max_shared)
        ids = tok.encode_batch([d.text for d in docs])
        counts, min_p = [], 1.0
        for k in range(args.keys):
            secret = Secret(hashlib.sha256(b"wmark calibration test key %d" % k).digest())
            detector = Detector([KeyMaterial(key_id=f"k{k}", secret=secret, spec=spec)])
            p = np.array([detector.detect(token_ids=i).p_value for i in ids])
            counts.append(int((p < 0.01).sum()))
            min_p = min(min_p, float(p.min()))
        outside = sum(not lo <= c <= hi for c in counts)
        print(
            f"| {label} | {sum(map(len, ids)):,} | {np.mean(counts):.1f} | {np.var(counts):.1f} "
            f"({len(docs) * 0.01 * 0.99:.1f}) | {outside}/{args.keys} | {min_p:.1e} |"
        )
        print(f"  counts: {counts}", flush=True)


if __name__ == "__main__":
    main()
