"""A loaded transformers model made ready for a precision and a device.

Precisions: "int8" (batch-invariant W8A8, see `wmark.generator.cpu.rowwise`; the CPU default
with AMX), "int8-fast" (the default on other CPUs: `cpu_precision`; the target's weights with a
scale per 128 input columns, its rows as one int8 part
plus their 16 largest channels in float32: `load_pair` maps it to "int8" with
`activations="outliers"` and `scale_cols=SCALE_COLS`), "exact-fp32"
(batch-invariant float32, slow: for small test models), "fp32", "bf16", "fp16" (stock kernels;
GPU default bf16; near-ties may flip between block shapes, ~1e-7 noise).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AttentionInterface, PreTrainedModel

from wmark.errors import BackendError
from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.attention import ATTENTION_NAME, rowwise_attention
from wmark.generator.cpu.rowwise import convert_linears, pack_int8
from wmark.generator.models import int8_store
from wmark.generator.models.fused import fuse_projections, int8_layers
from wmark.generator.models.smoothing import smooth_model

__all__ = ["PRECISIONS", "cpu_precision", "prepare_model"]

PRECISIONS = ("auto", "int8", "int8-fast", "exact-fp32", "fp32", "bf16", "fp16")


def cpu_precision() -> str:
    """The CPU's "auto" precision: "int8" where the int8 GEMM runs AMX tiles, "int8-fast" elsewhere.

    Both are within the quality bars of BENCHMARKS.md ("Quality"). Two activation parts double a
    forward's int8 arithmetic: the tile unit takes that at about the cost of streaming the
    weights, VNNI and AVX2 pay for it in every prompt and wide verify, where int8-fast's one part
    plus 16 float channels on block-scaled weights is both faster and nearer the float model
    (perplexity ratio 1.0008 against 1.0025). The tile unit cannot take block scales, so AMX
    CPUs keep int8. The two give different (each exact) distributions: text is reproducible
    across machines under one explicit precision, not under "auto".
    """
    return "int8" if _int8_gemm.backends()[0] == "amx" else "int8-fast"


def prepare_model(
    model: PreTrainedModel,
    precision: str,
    device: str,
    *,
    int8_cache: Path | None = None,
    calibration: Sequence[Sequence[int]] | None = None,
    activations: str = "one",
    scale_cols: int = 0,
) -> PreTrainedModel:
    """Cast/convert a loaded model for `precision` on `device` and put it in eval mode.

    `int8_cache`: where the int8 weights are kept between loads. A packed cache
    (`wmark.generator.models.int8_store`) is memory-mapped as it is; otherwise the linear layers are
    converted (from the plain int8 weights that file may hold, else quantised), fused, packed,
    and the packed result replaces the file.

    `calibration`: token IDs of the calibration text (`smoothing.calibration_ids`). Where int8
    layers are quantised here from float weights, the model is smoothed first
    (`wmark.generator.models.smoothing`), and the cache keeps what that changed in its float
    weights. None: quantised as they are (plain int8 weights in `int8_cache` come smoothed, or
    not, from their conversion).

    `activations`: how every int8 layer quantises its input rows (`RowInt8Linear.activations`):
    a target's "two" parts (the row, then what its int8 value left: ~16 bits) or "outliers"
    (one part plus each row's 16 largest channels in float32); a draft model, which only
    proposes, runs "one" part, faster.

    `scale_cols`: int8 weights quantised here take a scale per channel and block of this many
    input columns (`RowInt8Linear.quantize`; 0: per channel). `int8_cache` must be a cache of
    that kind: the caller keys it by the width.
    """
    if precision not in ("int8", "exact-fp32", "fp32", "bf16", "fp16"):
        raise ValueError(f"prepare_model takes int8, exact-fp32, fp32, bf16 or fp16, not {precision!r}")
    if precision in ("int8", "exact-fp32"):
        if device != "cpu":
            raise BackendError(f"precision {precision} is CPU-only; use bf16, fp16 or fp32 on {device}")
        model = model.to(torch.float32)
        divisors = None
        if precision == "int8" and int8_cache is not None and int8_store.is_packed(int8_cache):
            int8_store.load(model, int8_cache)
        else:
            from_float = int8_cache is None or not int8_cache.is_file()
            if precision == "int8" and calibration is not None and from_float:
                smoothing = smooth_model(model, calibration)
                divisors = None if smoothing is None else smoothing.dense
            convert_linears(
                model, "int8" if precision == "int8" else "fp32", int8_cache, scale_cols=scale_cols
            )
        if precision == "int8":
            fuse_projections(model)  # q/k/v and gate/up as one GEMM each: same numbers, less overhead
            layers = int8_layers(model)
            pack_int8(layers, workers=torch.get_num_threads())
            if int8_cache is not None and not int8_store.is_packed(int8_cache):
                int8_store.save(model, int8_cache, divisors=divisors)
            for layer in layers:
                layer.activations = activations
        AttentionInterface.register(ATTENTION_NAME, rowwise_attention)  # idempotent: a name -> function
        model.config._attn_implementation = ATTENTION_NAME
        for sub in model.modules():  # every layer reads the implementation from its config
            if hasattr(sub, "config"):
                sub.config._attn_implementation = ATTENTION_NAME
    else:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        model = model.to(device=device, dtype=dtype)
    return model.eval()
