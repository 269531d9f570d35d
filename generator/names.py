"""Sampler and drafter names and defaults, importable without torch (for CLI help and checks)."""

from __future__ import annotations

__all__ = [
    "AUTO",
    "DEFAULT_DRAFT_CONFIDENCE",
    "DRAFTER_HELP",
    "EMBEDDED",
    "METHOD_NAMES",
    "NGRAM",
]

METHOD_NAMES: tuple[str, ...] = (
    "basic-uwm",
    "pfr",
    "pfr-nowm",
    "mpfr",
    "vsps",
    "mws",
    "mse",
    "mse-pseudo",
    "gls",
)

AUTO, NGRAM, EMBEDDED = "auto", "ngram", "embedded"  # `--drafter` choices besides a model dir / id
DRAFTER_HELP = "ngram (prompt lookup), embedded (the 0.5B model), auto (both), or a local model dir / HF id."
# Dynamic lookahead threshold of `wmark generate` / `wmark demo` (measured fastest on CPU, with
# B = 2 and the auto drafter: BENCHMARKS.md). The library's SamplerConfig keeps 0, the paper's fixed L.
DEFAULT_DRAFT_CONFIDENCE = 0.3
