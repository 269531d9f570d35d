"""Sampler and drafter names and defaults, importable without torch (for CLI help and checks)."""

from __future__ import annotations

__all__ = [
    "AUTO",
    "DEFAULT_DRAFT_CONFIDENCE",
    "DEFAULT_LOOKAHEAD",
    "DRAFTER_HELP",
    "EMBEDDED",
    "METHOD_NAMES",
    "NGRAM",
    "PRECISION_HELP",
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
PRECISION_HELP = (
    "auto (CPU: int8 with AMX, else int8-fast; CUDA: bf16), int8 (smoothed int8 weights, each "
    "activation row in two int8 parts), int8-fast (CPU: int8 weights with a scale per 128 columns, "
    "each activation row one int8 part plus its 16 largest channels in float: faster prompts and "
    "verification where the CPU has no AMX), exact-fp32, fp32, bf16, fp16."
)
# The default dynamic lookahead (`SamplerConfig`, hence `wmark generate`, `wmark demo` and the
# service): a branch ends at a draft its drafter gave less than 0.8, up to L = 6. On CPU a drafter
# level costs a good part of a target forward (c in BENCHMARKS.md), so only a confident draft
# earns the next level; lookup chains (probability 1) still run deep (measured with B = 2 and the
# auto drafter: docs/benchmarks-history.md). The paper's fixed L = 4 is `lookahead=4,
# draft_confidence=0`: on a 2-core Zen 4 EPYC it decoded summaries at 0.95x `basic-uwm`'s speed.
DEFAULT_DRAFT_CONFIDENCE = 0.8
DEFAULT_LOOKAHEAD = 6
