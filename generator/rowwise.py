"""Batch-invariant CPU kernels: each row's output depends on that row only, bit for bit.

Speculative verification runs one forward over many tokens where autoregressive decoding runs
one token at a time. Stock kernels (BLAS GEMM vs GEMV, blocked attention) round differently
in the two cases, so logits differ by ~1e-7 and a near-tie in the race can flip: the emitted
text would then depend on the drafter. These kernels remove that:

- `RowInt8Linear`: int8 weights (per output channel) times int8 activations with a scale per
  row (W8A8; fbgemm, and oneDNN's AMX kernel for several rows where the CPU has AMX). Integer
  accumulation is exact in any order, and each row is scaled to [-1, 1] before quantisation,
  so no row sees another. On this CPU it is also ~5-10x faster
  than float32 for the 1-17 rows of a speculative block (docs/architecture.md §7 has the measurements).
- `RowFloatLinear`: float32, one GEMV per row (exact but slow; for small test models).
- `rowwise_attention`: each query row attends to exactly its visible keys (in cache order, which
  equals position order along a path) through the C kernel `_tree_attention`, whose result for a
  row depends on that row's query and keys only, so a tree row and the same context decoded
  alone compute identical numbers.
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
import functools
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from wmark.generator import _tree_attention

__all__ = [
    "ATTENTION_NAME",
    "RowFloatLinear",
    "RowInt8Linear",
    "convert_linears",
    "draft_kernels",
    "pack_int8",
    "rowwise_attention",
    "stock_attention",
    "tree_attention",
    "visible_keys",
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


@functools.cache
def activation_levels() -> int:
    """The largest |q| of a quantised activation that every int8 kernel sums exactly here: 127 or 63.

    Without VNNI (AVX2 CPUs), fbgemm multiplies unsigned 8-bit activations by signed 8-bit
    weights with `vpmaddubsw`, which adds each pair of products into a saturating int16:
    255 * 127 * 2 overflows it, so full 8-bit activations (q + 128 in [1, 255]) get wrong sums
    (measured on an AVX2 EPYC: 8,160 for 1,032,256). Activations of 7 bits (q in [-63, 63],
    stored as q + 64 in [1, 127]) cannot overflow (127 * 127 * 2 < 2^15); that is what PyTorch's
    `reduce_range` does for the same reason. (oneDNN sums 8-bit activations exactly on that CPU,
    but a layer can run either kernel, so it is probed too and the levels suit both.) A probe of
    the worst case decides, once per process.
    """
    layer = RowInt8Linear(
        torch.full((8, 64), 127, dtype=torch.int8), torch.ones(8, dtype=torch.float64), None
    )
    worst = torch.full((1, 64), 127.0)
    exact = 127.0 * 127 * 64
    fbgemm = _fbgemm_sums(worst, 128, layer.fbgemm_packing())
    if not bool((fbgemm == exact).all()):
        return 63
    if onednn_available() and not bool((_onednn_sums(worst, 128, layer.onednn_packing()) == exact).all()):
        return 63
    return 127


AMX_MIN_ROWS = 3
"""From this many rows on, `RowInt8Linear` runs oneDNN's AMX GEMM where the CPU has AMX.

Measured on the target's 28 layers of int8 GEMMs streamed from memory, one thread, Sapphire
Rapids class: fbgemm 140 / 151 / 165 / 182 / 223 ms for 1 / 2 / 3 / 4 / 8 rows, oneDNN with
AMX 150 / 150 / 153 / 153 / 164 ms. A verify row costs fbgemm ~6 % of a one-row GEMM pass and
AMX ~1.5 %; a single row is 7 % cheaper on fbgemm.
"""
AMX_DRAFT_ROWS = 8  # the same for a drafter's `dynamic` layers (its forwards have 1-4 rows)
PACK_ROWS = 8192  # output channels per fbgemm packing (see `RowInt8Linear.pack`)


def _joined(parts: Iterable[torch.Tensor]) -> torch.Tensor:
    """The outputs of a layer's packed pieces side by side (no copy for a single piece)."""
    pieces = list(parts)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


def _fbgemm_sums(q: torch.Tensor, zero: int, packed: list[Any]) -> torch.Tensor:
    """fbgemm's exact sums: it quantises its float input with scale 1 and `zero`, so q exactly."""
    return _joined(
        torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, zero, piece)
        for piece in packed
    )


def _onednn_sums(q: torch.Tensor, zero: int, packed: torch.Tensor) -> torch.Tensor:
    """oneDNN's exact sums of unsigned activations q + `zero` against the packed weights."""
    out = packed.shape[1]
    sums: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
        q.add(zero).to(torch.uint8),
        1.0,
        zero,
        packed,
        _unit_scales(out),
        _zero_points(out),
        None,
        1.0,
        0,
        torch.float32,
        "none",
        [],
        "",
    )
    return sums


@functools.lru_cache(maxsize=64)
def _unit_scales(out: int) -> torch.Tensor:
    return torch.ones(out)


@functools.lru_cache(maxsize=64)
def _zero_points(out: int) -> torch.Tensor:
    return torch.zeros(out, dtype=torch.int64)


@functools.cache
def onednn_available() -> bool:
    """Whether torch was built with oneDNN's int8 linear (the x86 wheels are)."""
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return bool(mkldnn and hasattr(torch.ops.onednn, "qlinear_prepack"))


@functools.cache
def amx_available() -> bool:
    """Whether this CPU has AMX tiles and torch has oneDNN's int8 linear (WMARK_INT8_AMX=0: never)."""
    if os.environ.get("WMARK_INT8_AMX", "1") == "0":
        return False
    if not onednn_available():
        return False
    init = getattr(torch._C._cpu, "_init_amx", None)  # asks the kernel for the tiles; False without AMX
    return bool(init()) if init is not None else False


class RowInt8Linear(nn.Module):
    """Linear layer with int8 weights and per-row int8 activations (batch-invariant).

    Each row is quantised with its own peak (q = round(levels x / peak), levels = 127, or 63 on CPUs
    whose fbgemm kernel would saturate: `activation_levels`), the integer products are
    accumulated exactly, and the float accumulator is scaled by the channel's scale and the row's
    peak in torch. Every kernel returns the exact integer sum as float32, so a row's output is
    bit for bit the same whichever kernel ran and however many rows rode along.

    The GEMM is fbgemm's, and oneDNN's AMX kernel from `AMX_MIN_ROWS` rows on where the CPU has
    AMX; the layer then holds both packings: the price of verify rows that cost ~1.5 % of a
    forward each instead of ~6 %. Without AMX oneDNN is no better: streaming the 1.5B target's
    28 layers on a 2-core AVX2 EPYC, one thread, it took 1.10 / 1.18 / 1.20x fbgemm's time at
    1 / 3 / 5 rows and 0.88 / 0.87 / 0.72x at 9 / 17 / 177 rows, and speculative blocks verify
    1-9 rows. Each packing is built on first need, from the weights or from the other packing.

    Args:
        weight_int8: (out, in) int8 weights.
        scale: (out,) float64 per-output-channel scales (weight = weight_int8 * scale).
        bias: (out,) float32 bias or None.
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self._weight: torch.Tensor | None = weight_int8  # until packed: stacking or cutting needs no unpack
        self._fbgemm: list[Any] | None = None  # fbgemm's packings of `PACK_ROWS` output channels each
        self._onednn: torch.Tensor | None = None  # oneDNN's packing, (in, out)
        self.scale = scale.detach().to(torch.float64)
        self._scale32 = self.scale.to(torch.float32)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.out_features, self.in_features = weight_int8.shape

    @property
    def packed(self) -> bool:
        """Whether the weights are held as kernel packings only (after `pack` or a first use)."""
        return self._weight is None

    def pack(self) -> None:
        """Build the packings this CPU's kernels use (done on first use; `pack_int8` does it at load).

        Packing is most of a model's load time (~0.1 s per projection of the 1.5B target), so
        layers that `fuse_projections` stacks are never packed on their own.
        """
        if self._weight is None:
            return
        self.fbgemm_packing()
        if amx_available():
            self.onednn_packing()
        self._weight = None

    def fbgemm_packing(self) -> list[Any]:
        """fbgemm's packing, built now if need be, `PACK_ROWS` output channels at a time: its
        packing grows faster than the matrix (the target's 151,936-row output layer took 6.8 s in
        one piece, 2.2 s in pieces)."""
        if self._fbgemm is None:
            weight, _ = self.int8_weight()
            with warnings.catch_warnings():
                # torch 2.13 deprecates quantized tensor *creation* (pytorch#184982); the fbgemm
                # kernels stay. When it is removed this needs torchao's int8 kernels instead.
                warnings.filterwarnings(
                    "ignore", message=".*quantized tensor creation.*", category=UserWarning
                )
                # Unit scales: the kernel returns the integer sums themselves, scaled in torch.
                self._fbgemm = [
                    torch.ops.quantized.linear_prepack(
                        torch._make_per_channel_quantized_tensor(
                            piece,
                            torch.ones(len(piece), dtype=torch.float64),
                            torch.zeros(len(piece), dtype=torch.int64),
                            0,
                        ),
                        None,
                    )
                    for piece in torch.split(weight, PACK_ROWS)
                ]
        return self._fbgemm

    def onednn_packing(self) -> torch.Tensor:
        """oneDNN's packing, built now if need be."""
        if self._onednn is None:
            self._onednn = torch.ops.onednn.qlinear_prepack(self.int8_weight()[0], None)
        return self._onednn

    @staticmethod
    def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Symmetric per-output-channel int8: (weight_int8, scale)."""
        weight = weight.detach().to(torch.float32)
        scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0).to(torch.float64)
        weight_int8 = torch.clamp(torch.round(weight / scale[:, None]), -127, 127).to(torch.int8)
        return weight_int8, scale

    def __deepcopy__(self, memo: dict[int, Any]) -> RowInt8Linear:
        # packed weights are opaque objects that cannot be copied: pack a copy anew
        weight, scale = self.int8_weight()
        return RowInt8Linear(weight.clone(), scale.clone(), None if self.bias is None else self.bias.detach())

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight_int8, scale) as given to the constructor (to stack or cut layers)."""
        if self._weight is not None:
            return self._weight, self.scale
        if self._fbgemm is not None:
            pieces = [torch.ops.quantized.linear_unpack(packed)[0].int_repr() for packed in self._fbgemm]
            return torch.cat(pieces), self.scale
        assert self._onednn is not None
        return self._onednn.to_dense().T.contiguous(), self.scale

    def _sums(self, q: torch.Tensor) -> torch.Tensor:
        """Exact integer sums q . W^T as float32, for integer-valued float rows q in [-levels, levels]."""
        self.pack()
        zero = activation_levels() + 1  # q + zero is unsigned: [1, 255] or [1, 127]
        if self._onednn is not None and (self._fbgemm is None or q.shape[0] >= AMX_MIN_ROWS):
            return _onednn_sums(q, zero, self._onednn)
        return _fbgemm_sums(q, zero, self.fbgemm_packing())

    def _exact(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.float32)
        peak = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        levels = float(activation_levels())
        out = self._sums(torch.round(rows * (levels / peak))).mul_(self._scale32).mul_(peak / levels)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dynamic(self, x: torch.Tensor) -> torch.Tensor:
        """The layer with fbgemm's dynamic quantisation (per-tensor scale, 7-bit activations):
        cheaper, not batch-invariant; what `draft_kernels` selects, for a model that only drafts.
        Many rows at once (a drafter's prompt) go to the AMX kernel instead, where there is one:
        from `AMX_DRAFT_ROWS` rows on it beats fbgemm's fused dynamic call despite its small ops."""
        self.pack()
        if self._onednn is not None and x.numel() >= AMX_DRAFT_ROWS * self.in_features:
            return self._exact(x)
        x = x.to(torch.float32)
        drafted = _joined(
            torch.ops.quantized.linear_dynamic(x, packed, True) for packed in self.fbgemm_packing()
        )
        drafted = drafted.mul_(self._scale32)
        return drafted if self.bias is None else drafted + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _DYNAMIC.get():  # a drafter (`draft_kernels`)
            return self.dynamic(x)
        return self._exact(x)


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


def pack_int8(layers: Iterable[RowInt8Linear], workers: int = 1) -> None:
    """Pack `layers` now, so that no forward pays for it.

    Packing is most of a model's load time (fbgemm ~0.1 s per projection of the 1.5B target) and
    each layer packs on its own with the GIL released, so `workers` threads share the layers
    (`prepare_model` passes torch's thread count: the cores free for this process).
    """
    todo = list(layers)
    if workers <= 1 or len(todo) < 2:
        for layer in todo:
            layer.pack()
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wmark-pack") as pool:
        list(pool.map(RowInt8Linear.pack, todo))  # list(): re-raises a worker's exception here


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
    """Attention of each query row over exactly its visible keys (`tree_attention`; stock SDPA
    under `stock_attention`).

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
    return tree_attention(query, key, value, visible_keys(attention_mask), scaling), None


_LAST_MASK: list[tuple[torch.Tensor, torch.Tensor]] = []  # (mask, visible) of the last call


def visible_keys(attention_mask: torch.Tensor) -> torch.Tensor:
    """(q, kv) uint8, 1 where the additive 4D mask lets a row see a key. Every layer of a forward
    gets the same mask tensor (each forward builds its own: `HFSession.extend`), so the last
    one's answer is kept and reused while the same tensor comes back."""
    last = _LAST_MASK[0] if _LAST_MASK else None  # one read: another thread may replace it
    if last is not None and last[0] is attention_mask:
        return last[1]
    visible = (attention_mask[0, 0] == 0).to(torch.uint8).contiguous()
    _LAST_MASK[:] = [(attention_mask, visible)]
    return visible


def tree_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Each query row's attention over exactly its visible keys, in cache order (the C kernel of
    `wmark.generator._tree_attention`): a row's numbers depend on its query and those keys only.

    Args:
        query: (1, heads, q, d) float32 on the CPU (any strides).
        key, value: (1, kv_heads, kv, d), heads a multiple of kv_heads (GQA).
        visible: (q, kv) uint8, nonzero where a row sees a key.
        scaling: the factor of the scores (1/sqrt(d)).

    Returns:
        (1, q, heads, d) float32.
    """
    _, heads, n_query, dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    if query.dtype != torch.float32 or query.device.type != "cpu":
        raise ValueError("rowwise attention runs in float32 on the CPU")
    out = torch.empty(1, n_query, heads, dim)
    _tree_attention.attend(
        query[0].contiguous().numpy(),
        key[0].contiguous().numpy(),
        value[0].contiguous().numpy(),
        visible.numpy(),
        out.numpy(),
        heads,
        kv_heads,
        n_query,
        n_keys,
        dim,
        scaling,
    )
    return out
