"""Detection throughput against tokenisation alone, side by side (tokens/s).

    .venv/bin/python bench/detect_throughput.py [--docs 2000] [--rounds 5] [--tables one,batch]

Two tables, each over its own corpus, with rounds alternating between the rows so that drift of
this shared machine hits all of them alike; the median of the rounds is reported, with ratios to
tokenisation.

- `one`: one document at a time, on Python files (`python_files`: the venv's site-packages,
  a deterministic choice). The tokenizer encoding one text at a time (`Tokenizer.encode`, the
  token IDs as a list: what any caller of the tokenizer pays) against `Detector.detect(text)`
  with 1 key and the readings on (`wmark.detector.readings`: Python files often get two), and
  with the readings off (`normalize=False`) for what the readings cost.
- `batch`: many documents at once, on the human corpus (`system_corpus`): the tokenizer's own
  batch encoding (the same call `detect_many` makes), `detect_many` with 1 key and with 10 keys
  (tokenise + windows + dedup + keyed pivots + exact p-value + verdict), and, for reference,
  detection with the same PRF written in Python (hashlib HMAC per position, Philox vectorised in
  numpy over all positions) instead of the C path, and Python's `hmac` module computing only the
  per-position HMAC-SHA256.

Everything built on first use (tokenizer tables, the Unicode tables of the readings, the
tokenizer's usual casings) is built before the timed rounds, as a service does at start-up.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import statistics
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark import prf as prf_mod
from wmark.detector import Detector, TextTokenizer
from wmark.detector.readings import warm_tables
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json


def _keys(spec: WatermarkSpec, n: int) -> list[KeyMaterial]:
    return [
        KeyMaterial(
            key_id=f"wk_bench{i:02d}", secret=Secret(hashlib.sha256(b"bench%d" % i).digest()), spec=spec
        )
        for i in range(n)
    ]


def python_files(n: int, *, smallest: int = 500, largest: int = 8000) -> list[tuple[str, str]]:
    """(path, text) of n Python files of this environment's site-packages: of the UTF-8 files of
    `smallest` to `largest` bytes, sorted by path, n spread evenly (the same files wherever the
    same packages are installed). Whole files, as a scan reads them."""
    root = Path(sysconfig.get_paths()["purelib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
            if smallest <= len(data) <= largest and (text := data.decode("utf-8")).strip():
                found.append((str(path.relative_to(root)), text))
        except (OSError, UnicodeDecodeError):
            continue
    return [found[i * len(found) // n] for i in range(min(n, len(found)))]


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


Rows = dict[str, tuple[Callable[[], object], int]]


def _table(rows: Rows, rounds: int, base: str) -> None:
    """Run the rows in alternating rounds and print each one's median rate and its ratio to `base`."""
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, (fn, _n) in rows.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base_rate = rows[base][1] / statistics.median(times[base])
    print("| path | tokens/s | ratio to tokenisation |")
    print("|---|---:|---:|")
    for name, (_fn, n) in rows.items():
        rate = n / statistics.median(times[name])
        print(f"| {name} | {rate:,.0f} | {rate / base_rate:.2f}x |")
    print()


def _one_at_a_time(data: bytes, tok: TextTokenizer, docs: int, rounds: int) -> None:
    texts = [text for _, text in python_files(docs)]
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    spec = WatermarkSpec(tokenizer=tok.ref)
    tokenizers = {tok.sha256: data}
    readings = Detector(_keys(spec, 1), tokenizers)
    raw = Detector(_keys(spec, 1), tokenizers, normalize=False)
    warm_tables()
    for text in texts:  # every table built on first use (splice tables, usual casings)
        readings.detect(text)
    raw.detect(texts[0])
    encoder = Tokenizer.from_str(data.decode("utf-8"))

    def encode_each() -> list[list[int]]:
        return [encoder.encode(text, add_special_tokens=False).ids for text in texts]

    rows: Rows = {
        "tokenizer, one text at a time (`Tokenizer.encode(text).ids`)": (encode_each, n_tokens),
        "`Detector.detect(text)`, 1 key, readings on": (
            lambda: [readings.detect(t) for t in texts],
            n_tokens,
        ),
        "`Detector.detect(text)`, 1 key, readings off (`normalize=False`)": (
            lambda: [raw.detect(t) for t in texts],
            n_tokens,
        ),
    }
    print(
        f"One document at a time: {len(texts)} Python files, {n_tokens:,} tokens; "
        f"{rounds} alternating rounds, median\n"
    )
    _table(rows, rounds, next(iter(rows)))


def _batch(data: bytes, tok: TextTokenizer, docs: int, rounds: int) -> None:
    texts = [d.text for d in system_corpus(docs)]
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    spec = WatermarkSpec(tokenizer=tok.ref)
    tokenizers = {tok.sha256: data}
    one, ten = Detector(_keys(spec, 1), tokenizers), Detector(_keys(spec, 10), tokenizers)
    warm_tables()
    for d in (one, ten):
        d.detect_many(texts)  # every table built on first use

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
        # the C paths that compute positions and pivots in one pass step aside (they return None
        # as on an install without the C extension): positions from `scored_positions`, pivots here
        fast = prf_mod.window_pivots
        one_pass = prf_mod.KeyedSource.scored_pivots, prf_mod.KeyedSource.scored_pivots_many
        prf_mod.window_pivots = _python_window_pivots  # type: ignore[assignment]
        prf_mod.KeyedSource.scored_pivots = lambda *_: None  # type: ignore[method-assign,assignment]
        prf_mod.KeyedSource.scored_pivots_many = lambda *_: None  # type: ignore[method-assign,assignment]
        try:
            one.detect_many(texts)
        finally:
            prf_mod.window_pivots = fast
            prf_mod.KeyedSource.scored_pivots, prf_mod.KeyedSource.scored_pivots_many = one_pass

    rows: Rows = {
        "tokenisation only (encode_batch)": (lambda: one.tokenizer(tok.sha256).encode_batch(texts), n_tokens),
        "detection, 1 key": (lambda: one.detect_many(texts), n_tokens),
        "detection, 10 keys": (lambda: ten.detect_many(texts), n_tokens),
        "detection, 1 key, PRF in Python (hashlib + numpy)": (python_prf_detection, n_tokens),
        "HMAC-SHA256 only, Python hmac module": (python_hmac_only, n_tokens),
    }
    print(
        f"Many documents at once: {len(texts)} human documents, {n_tokens:,} tokens; PRF backend: "
        f"{prf_mod.fast_backend()}; {rounds} alternating rounds, median\n"
    )
    _table(rows, rounds, "tokenisation only (encode_batch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tables", default="one,batch", help="one, batch, or both (one,batch)")
    args = parser.parse_args()
    tables = set(args.tables.split(","))
    if not tables or tables - {"one", "batch"}:
        parser.error(f"--tables: one, batch or one,batch, got {args.tables!r}")

    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    if "one" in tables:
        _one_at_a_time(data, tok, args.docs, args.rounds)
    if "batch" in tables:
        _batch(data, tok, args.docs, args.rounds)


if __name__ == "__main__":
    main()
