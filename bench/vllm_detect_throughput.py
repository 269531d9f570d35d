"""Detection of vLLM's native watermark: wmark against vLLM's own detector, side by side (tokens/s).

    make vllm-venv   # once: vLLM's own venv with wmark installed in it (see the Makefile)
    ~/.cache/wmark/vllm-venv-0.32.0-torch2.13.0/bin/python bench/vllm_detect_throughput.py [--docs 2000]

Both score the same token IDs (human text of this machine's system corpus, tokenised once with
the embedded tokenizer, outside the timed region) under the same vLLM key, one document at a
time as a service would: vLLM's `GumbelWatermarkDetector.detect` / the dual-key detector, and
wmark's `Detector.detect(token_ids=...)` with the key registered as a vLLM scheme. The p-values
are compared on every document first (the dual-key detector's come from torch's gammaincc,
itself ~1e-9 off the exact tail; tests/unit/core/test_vllm_gumbel.py). Rounds alternate between
the rows so that drift of this shared machine hits all of them alike; the median round is
reported.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

from vllm.v1.watermarking import DualKeyGumbelWatermarkDetector, GumbelWatermarkDetector

from wmark import KeyMaterial, TokenizerRef
from wmark.detector import Detector, TextTokenizer
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json
from wmark.prf import fast_backend
from wmark.vllm_gumbel import VllmWatermarkConfig

KEY = 0x5EED_0F_B3_4C_11_A2


def _key(algorithm: str, ref: TokenizerRef) -> KeyMaterial:
    config = VllmWatermarkConfig(key=KEY, algorithm=algorithm)
    return KeyMaterial(key_id=f"wk_{algorithm}", secret=config.secret(), spec=config.spec(ref))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    tok = TextTokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    docs = [ids for ids in tok.encode_batch([d.text for d in system_corpus(args.docs)]) if len(ids)]
    as_lists = [ids.tolist() for ids in docs]
    n_tokens = sum(len(ids) for ids in docs)

    rows: dict[str, Callable[[], list[float]]] = {}
    for algorithm, vllm_cls in (
        ("gumbel", GumbelWatermarkDetector),
        ("dual_key_gumbel", DualKeyGumbelWatermarkDetector),
    ):
        theirs = vllm_cls(KEY)
        ours = Detector([_key(algorithm, tok.ref)])
        rows[f"vLLM {vllm_cls.__name__}.detect"] = lambda d=theirs: [
            d.detect(ids).p_value for ids in as_lists
        ]
        rows[f"wmark Detector.detect, {algorithm} key"] = lambda d=ours: [
            math.exp(d.detect(token_ids=ids).keys[0].log_p) for ids in docs
        ]

    names = list(rows)
    pairs = list(zip(names[::2], names[1::2], strict=True))
    worst = {}  # largest relative p-value difference per pair, where vLLM's p-value is not 0
    for theirs_name, ours_name in pairs:
        diffs = [
            abs(a - b) / a for a, b in zip(rows[theirs_name](), rows[ours_name](), strict=True) if a > 0.0
        ]
        worst[ours_name] = max(diffs)

    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    print(
        f"corpus: {len(docs)} documents, {n_tokens:,} token IDs; wmark PRF backend: {fast_backend()}; "
        f"{args.rounds} alternating rounds, median"
    )
    print()
    print("| detector | tokens/s | wmark / vLLM | largest relative p-value difference |")
    print("|---|---:|---:|---:|")
    for theirs_name, ours_name in pairs:
        base = n_tokens / statistics.median(times[theirs_name])
        rate = n_tokens / statistics.median(times[ours_name])
        print(f"| {theirs_name} | {base:,.0f} | | |")
        print(f"| {ours_name} | {rate:,.0f} | {rate / base:.1f}x | {worst[ours_name]:.1e} |")


if __name__ == "__main__":
    main()
