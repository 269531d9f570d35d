"""Batch-invariant CPU kernels: each row's output depends on that row only, bit for bit.

Speculative verification runs one forward over many tokens where autoregressive decoding runs
one token at a time. Stock kernels (BLAS GEMM vs GEMV, blocked attention) round differently
in the two cases, so logits differ by ~1e-7 and a near-tie in the race can flip: the emitted
text would then depend on the drafter. These kernels remove that:

- `RowInt8Linear`: int8 weights (per output channel) times int8 activations with a scale per
  row (W8A8, fbgemm). Integer accumulation is exact in any order, and each row is scaled to
  [-1, 1] before quantisation, so no row sees another. On this CPU it is also ~5-10x faster
  than float32 for the 1-17 rows of a speculative block (docs/architecture.md §7 has the measurements).
- `RowFloatLinear`: float32, one GEMV per row (exact but slow; for small test models).
- `rowwise_attention`: each query row attends to exactly its visible keys (gathered in cache
  order, which equals position order along a path) with the same one-row kernel, so a tree
  row and the same context decoded alone compute identical numbers.
RMSNorm, rotary embeddings, activations and residuals are row-local already.

The prompt is the exception: every session fills the cache with the prompt (minus its last
token) in one forward under stock SDPA (`stock_attention`), which is deterministic for the same
input, so all sessions of a prompt start from identical caches without a per-row loop over the
prompt. A drafter runs every forward that way (`HFModel(exact_attention=False)`): it only
proposes, so its rounding never reaches the text, and one SDPA call per layer is cheaper than
the row loop. Its int8 layers also drop the per-row activation scale for fbgemm's dynamic
quantisation (`draft_kernels`): one fused call instead of six small ops per layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

__all__ = [
    "ATTENTION_NAME",
    "RowFloatLinear",
    "RowInt8Linear",
    "convert_linears",
    "draft_kernels",
    "rowwise_attention",
    "stock_attention",
]

ATTENTION_NAME = "wmark_rowwise"
_STOCK: contextvars.ContextVar[bool] = contextvars.ContextVar("wmark_stock_attention", default=False)
_DYNAMIC: contextvars.ContextVar[bool] = contextvars.ContextVar("wmark_dynamic_int8", default=False)


@contextlib.contextmanager
def stock_attention() -> Iterator[None]:
    """Within this block, attention runs as stock SDPA (prompt prefill, drafter forwards)."""
    token = _STOCK.set(True)
    try:
        yield
    finally:
        _STOCK.reset(token)


@contextlib.contextmanager
def draft_kernels() -> Iterator[None]:
    """Within this block, the cheapest kernels, batch-invariant or not: for a model that only drafts.

    Attention runs as stock SDPA (`stock_attention`), and `RowInt8Linear` quantises its input
    with fbgemm's dynamic quantisation (one scale for the whole input, computed inside the GEMM
    call) instead of a scale per row: at the 1-4 rows of a drafter forward the per-row scaling's
    small ops (abs, max, divide, multiply) cost about as much as the 0.5B model's smaller GEMMs.
    A drafter's rounding changes which tokens it proposes, never the text (the target's).
    """
    stock, dynamic = _STOCK.set(True), _DYNAMIC.set(True)
    try:
        yield
    finally:
        _DYNAMIC.reset(dynamic)
        _STOCK.reset(stock)


_QUINT8_ZERO = 128  # symmetric activations in quint8: q = round(127 x) + 128


class RowInt8Linear(nn.Module):
    """Linear layer with int8 weights and per-row int8 activations (batch-invariant).

    Args:
        weight_int8: (out, in) int8 weights.
        scale: (out,) float64 per-output-channel scales (weight = weight_int8 * scale).
        bias: (out,) float32 bias or None.
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        with warnings.catch_warnings():
            # torch 2.13 deprecates quantized tensor *creation* (pytorch#184982); the fbgemm kernels
            # stay. When it is removed this needs torchao's int8 kernels instead.
            warnings.filterwarnings("ignore", message=".*quantized tensor creation.*", category=UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                weight_int8, scale, torch.zeros_like(scale, dtype=torch.int64), 0
            )
            self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.out_features, self.in_features = weight_int8.shape

    @staticmethod
    def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Symmetric per-output-channel int8: (weight_int8, scale)."""
        weight = weight.detach().to(torch.float32)
        scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0).to(torch.float64)
        weight_int8 = torch.clamp(torch.round(weight / scale[:, None]), -127, 127).to(torch.int8)
        return weight_int8, scale

    def dynamic(self, x: torch.Tensor) -> torch.Tensor:
        """The layer with fbgemm's dynamic quantisation (per-tensor scale, 7-bit activations):
        cheaper, not batch-invariant; what `draft_kernels` selects, for a model that only drafts."""
        drafted: torch.Tensor = torch.ops.quantized.linear_dynamic(x.to(torch.float32), self._packed, True)
        return drafted if self.bias is None else drafted + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _DYNAMIC.get():  # a drafter (`draft_kernels`)
            return self.dynamic(x)
        rows = x.reshape(-1, self.in_features).to(torch.float32)
        peak = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        out: torch.Tensor = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            rows / peak, 1.0 / 127.0, _QUINT8_ZERO, self._packed
        )
        out = out * peak
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class RowFloatLinear(nn.Module):
    """float32 Linear computed one row at a time (batch-invariant, slow)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().float(), requires_grad=False)
        self.bias = (
            None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.cat(
            [nn.functional.linear(rows[i : i + 1], self.weight, self.bias) for i in range(rows.shape[0])]
        )
        return out.reshape(*x.shape[:-1], self.weight.shape[0])


def convert_linears(model: nn.Module, kind: str, int8_cache: Path | None = None) -> int:
    """Replace every nn.Linear of `model` by its batch-invariant version; returns how many.

    Args:
        model: the model, modified in place.
        kind: "int8" or "fp32".
        int8_cache: a safetensors file of the quantised weights: read if it exists (quantising a
            1.5B model takes half a minute, reading its int8 weights a few seconds), else written.
    """
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    cached: dict[str, torch.Tensor] = {}
    if kind == "int8" and int8_cache is not None and int8_cache.is_file():
        cached = safetensors.torch.load_file(str(int8_cache))
    fresh: dict[str, torch.Tensor] = {}
    for name, module in targets:
        replacement: nn.Module
        if kind == "fp32":
            replacement = RowFloatLinear(module)
        else:
            if f"{name}.q" in cached:
                weight_int8, scale = cached[f"{name}.q"], cached[f"{name}.scale"]
            else:
                weight_int8, scale = RowInt8Linear.quantize(module.weight)
                fresh[f"{name}.q"], fresh[f"{name}.scale"] = weight_int8, scale
            replacement = RowInt8Linear(weight_int8, scale, module.bias)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
    if fresh and int8_cache is not None:
        int8_cache.parent.mkdir(parents=True, exist_ok=True)
        # A file of this process's own: two loads at once must not write into one partial file.
        fd, partial = tempfile.mkstemp(dir=int8_cache.parent, prefix=f".{int8_cache.name}.")
        os.close(fd)
        try:
            safetensors.torch.save_file({**cached, **fresh}, partial)
            os.replace(partial, int8_cache)  # readers never see half a file
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
    return len(targets)


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,  # noqa: ARG001 - inference only
    **kwargs: Any,  # noqa: ARG001 - the attention interface passes extras we do not use
) -> tuple[torch.Tensor, None]:
    """Attention with one query row at a time over exactly its visible keys.

    Args:
        module: the attention module (for `num_key_value_groups`).
        query: (1, heads, q, d).
        key, value: (1, kv_heads, kv, d), the whole cache plus the new rows.
        attention_mask: (1, 1, q, kv) additive mask (0 where visible); required.
        scaling: 1/sqrt(d).

    Returns:
        ((1, q, heads, d) attention output, None).
    """
    if attention_mask is None or attention_mask.dim() != 4:
        raise ValueError("rowwise attention needs an explicit 4D mask from the session")
    if _STOCK.get():
        groups = int(getattr(module, "num_key_value_groups", 1))
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        out = nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling
        )
        return out.transpose(1, 2).contiguous(), None
    _, heads, n_query, dim = query.shape
    kv_heads = key.shape[1]
    # Query heads sharing a key/value head (GQA) form one small matrix per group: no copy of the
    # cache per query head, and always the same (group, dim) x (dim, n) shape for a given row.
    grouped = query.view(1, kv_heads, heads // kv_heads, n_query, dim)
    visible = attention_mask[0, 0] == 0  # (q, kv)
    rows = []
    for i in range(n_query):
        idx = visible[i].nonzero().squeeze(1)
        k, v = key.index_select(2, idx), value.index_select(2, idx)  # (1, kv_heads, n, dim)
        weights = torch.matmul(grouped[:, :, :, i], k.transpose(2, 3)) * scaling  # (1, kv_heads, g, n)
        weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        rows.append(torch.matmul(weights, v).reshape(1, heads, 1, dim))
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None
