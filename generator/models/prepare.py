"""A loaded transformers model made ready for a precision and a device.

Precisions: "int8" (CPU default: batch-invariant W8A8, see `wmark.generator.cpu.rowwise`),
"exact-fp32" (batch-invariant float32, slow: for small test models), "fp32", "bf16", "fp16"
(stock kernels; GPU default bf16; near-ties may flip between block shapes, ~1e-7 noise).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AttentionInterface, PreTrainedModel

from wmark.errors import BackendError
from wmark.generator.cpu.attention import ATTENTION_NAME, rowwise_attention
from wmark.generator.cpu.rowwise import convert_linears, pack_int8
from wmark.generator.models import int8_store
from wmark.generator.models.fused import fuse_projections, int8_layers

__all__ = ["PRECISIONS", "prepare_model"]

PRECISIONS = ("auto", "int8", "exact-fp32", "fp32", "bf16", "fp16")


def prepare_model(
    model: PreTrainedModel, precision: str, device: str, *, int8_cache: Path | None = None
) -> PreTrainedModel:
    """Cast/convert a loaded model for `precision` on `device` and put it in eval mode.

    `int8_cache`: where the int8 weights are kept between loads. A packed cache
    (`wmark.generator.models.int8_store`) is memory-mapped as it is; otherwise the linear layers are
    converted (from the plain int8 weights that file may hold, else quantised), fused, packed,
    and the packed result replaces the file.
    """
    if precision in ("int8", "exact-fp32"):
        if device != "cpu":
            raise BackendError(f"precision {precision} is CPU-only; use bf16, fp16 or fp32 on {device}")
        model = model.to(torch.float32)
        if precision == "int8" and int8_cache is not None and int8_store.is_packed(int8_cache):
            int8_store.load(model, int8_cache)
        else:
            convert_linears(model, "int8" if precision == "int8" else "fp32", int8_cache)
        if precision == "int8":
            fuse_projections(model)  # q/k/v and gate/up as one GEMM each: same numbers, less overhead
            pack_int8(int8_layers(model), workers=torch.get_num_threads())
            if int8_cache is not None and not int8_store.is_packed(int8_cache):
                int8_store.save(model, int8_cache)
        AttentionInterface.register(ATTENTION_NAME, rowwise_attention)  # idempotent: a name -> function
        model.config._attn_implementation = ATTENTION_NAME
        for sub in model.modules():  # every layer reads the implementation from its config
            if hasattr(sub, "config"):
                sub.config._attn_implementation = ATTENTION_NAME
    else:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        model = model.to(device=device, dtype=dtype)
    return model.eval()
