"""Detection throughput against tokenisation alone, side by side on one corpus (tokens/s).

    .venv/bin/python bench/detect_throughput.py [--docs 2000] [--rounds 5]

Rows: the tokenizer's own batch encoding (the same call detection makes), full detection with
1 key and with 10 keys (tokenise + windows + dedup + keyed pivots + exact p-value + verdict),
and, for reference, detection with the same PRF written in Python (hashlib HMAC per position,
Philox vectorised in numpy over all positions) instead of the C path, and Python's `hmac` module
computing only the per-position HMAC-SHA256. Rounds
alternate between the rows so that drift of this shared machine hits all of them alike; the
median of the rounds is reported, with ratios to tokenisation.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import statistics
import time
from collections.abc import Callable

import numpy as np

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark import prf as prf_mod
from wmark.detector import Detector, TextTokenizer
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json


def _keys(spec: WatermarkSpec, n: int) -> list[KeyMaterial]:
    return [
        KeyMaterial(
            key_id=f"wk_bench{i:02d}", secret=Secret(hashlib.sha256(b"bench%d" % i).digest()), spec=spec
        )
        for i in range(n)
    ]


def _python_window_pivots(
    key: bytes, prefix: bytes, windows: np.ndarray, tokens: np.ndarray, *, threads: int = 1
) -> np.ndarray:
    """The PRF as a good pure-Python port would do it: hashlib per position, numpy Philox in bulk."""
    del threads
    seeds = b"".join(
        hmac.new(key, prefix + w.astype(">u4").tobytes(), hashlib.sha256).digest() for w in windows
    )
    words = np.frombuffer(seeds, dtype="<u4").reshape(-1, 8).astype(np.uint64)
    counters = np.stack(
        [tokens.astype(np.uint64), np.ones(len(tokens), np.uint64), words[:, 2], words[:, 3]], 1
    )
    out = prf_mod.philox4x32_10(counters, words[:, :2])
    x = (out[:, 1] << np.uint64(20)) | (out[:, 0] >> np.uint64(12))
    return (x.astype(np.float64) + 0.5) * 2.0**-52


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    texts = [d.text for d in system_corpus(args.docs)]
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    spec = WatermarkSpec(tokenizer=tok.ref)
    tokenizers = {tok.sha256: data}
    one, ten = Detector(_keys(spec, 1), tokenizers), Detector(_keys(spec, 10), tokenizers)
    for d in (one, ten):
        # parse tokenizer.json and build the splice tables outside the timed region
        assert d.tokenizer(tok.sha256).splice_tables is not None

    all_ids = tok.encode_batch(texts)
    messages = [
        b"wmark.ctx\x00\x00\x00\x01" + ids[i : i + 4].astype(">u4").tobytes()
        for ids in all_ids
        for i in range(len(ids) - 4)
    ]
    secret = hashlib.sha256(b"bench0").digest()

    def python_hmac_only() -> None:
        for msg in messages:
            hmac.new(secret, msg, hashlib.sha256).digest()

    def python_prf_detection() -> None:
        fast = prf_mod.window_pivots
        prf_mod.window_pivots = _python_window_pivots  # type: ignore[assignment]
        try:
            one.detect_many(texts)
        finally:
            prf_mod.window_pivots = fast

    rows: dict[str, tuple[Callable[[], object], int]] = {
        "tokenisation only (encode_batch)": (lambda: one.tokenizer(tok.sha256).encode_batch(texts), n_tokens),
        "detection, 1 key": (lambda: one.detect_many(texts), n_tokens),
        "detection, 10 keys": (lambda: ten.detect_many(texts), n_tokens),
        "detection, 1 key, PRF in Python (hashlib + numpy)": (python_prf_detection, n_tokens),
        "HMAC-SHA256 only, Python hmac module": (python_hmac_only, n_tokens),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (fn, _n) in rows.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    base = n_tokens / statistics.median(times["tokenisation only (encode_batch)"])
    print(
        f"corpus: {len(texts)} documents, {n_tokens:,} tokens; PRF backend: {prf_mod.fast_backend()}; "
        f"{args.rounds} alternating rounds, median"
    )
    print()
    print("| path | tokens/s | ratio to tokenisation |")
    print("|---|---:|---:|")
    for name, (_fn, n) in rows.items():
        rate = n / statistics.median(times[name])
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
