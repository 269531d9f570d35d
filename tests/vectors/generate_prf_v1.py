"""Regenerate prf_v1.json from the numpy reference. Run only when defining a NEW PRF version:
the committed file is the contract every later release (and every port) must reproduce.

    python tests/vectors/generate_prf_v1.py > tests/vectors/prf_v1.json
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from wmark.prf import FreeSource, KeyedSource, seed_uniforms
from wmark.secret import Secret
from wmark.spec import TokenizerRef, WatermarkSpec


def main() -> None:
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="t", sha256="0" * 64, vocab_size=151936))
    secrets = [bytes(range(32)), hashlib.sha256(b"wmark golden").digest(), b"\xff" * 16]
    windows = [[0, 0, 0, 0], [1, 2, 3, 4], [151935, 17, 0, 65535], [4294967295, 1, 2, 3]]
    tokens = [0, 1, 2, 50, 151935, 65536, 4294967295]
    arrivals = [1, 2, 3, 8, 1000]
    seeds = []
    for secret in secrets:
        source = KeyedSource(Secret(secret), spec)
        for window in windows:
            seed = source.seed(window)
            grid_v, grid_j = np.meshgrid(tokens, arrivals, indexing="ij")
            u = seed_uniforms(seed, grid_v, grid_j)
            seeds.append(
                {
                    "secret": secret.hex(),
                    "spec_version": spec.spec_version,
                    "window": window,
                    "seed": seed.hex(),
                    "tokens": tokens,
                    "arrivals": arrivals,
                    "uniforms": [[float(x).hex() for x in row] for row in u],
                }
            )
    free = FreeSource(b"\x07" * 32, spec.spec_version)
    free_seeds = [
        {"position": p, "window": w, "seed": free.seed(p, w).hex()}
        for p, w in [(0, []), (5, [1, 2, 3, 4]), (4096, [9, 9, 9, 9])]
    ]
    doc = {
        "prf": {"name": spec.prf.name, "version": spec.prf.version},
        "keyed_window": seeds,
        "free": {"nonce": (b"\x07" * 32).hex(), "spec_version": spec.spec_version, "seeds": free_seeds},
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
