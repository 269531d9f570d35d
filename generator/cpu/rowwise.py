"""Batch-invariant CPU linear layers: each row's output depends on that row only, bit for bit.

Speculative verification runs one forward over many tokens where autoregressive decoding runs
one token at a time. Stock kernels (BLAS GEMM vs GEMV, blocked attention) round differently
in the two cases, so logits differ by ~1e-7 and a near-tie in the race can flip: the emitted
text would then depend on the drafter. These kernels remove that:

- `RowInt8Linear`: int8 weights (per output channel) times int8 activations with a scale per
  row (W8A8), through wmark's own GEMM (`wmark.generator.cpu._int8_gemm`): each row is quantised
  with its own peak and its integer products are summed exactly, so no row sees another, and
  the sums are the same on every CPU (AVX-512 VNNI, AVX2 and portable builds). Its weights are
  packed in a layout that is stored in the model cache and memory-mapped at load.
- `RowFloatLinear`: float32, one GEMV per row (exact but slow; for small test models).
- attention row by row: `wmark.generator.cpu.attention`.
RMSNorm, rotary embeddings, activations and residuals are row-local already.

The GEMM's thread count per call is a thread-local (`gemm_threads_for`), set by the session
from its model's `ForwardPlan`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import safetensors.torch
import torch
from torch import nn

from wmark.generator.cpu import _int8_gemm

__all__ = [
    "ACTIVATIONS",
    "PLAIN",
    "RMS_NORM",
    "SWIGLU",
    "RowFloatLinear",
    "RowInt8Linear",
    "SCALE_COLS",
    "convert_linears",
    "gemm_threads",
    "gemm_threads_for",
    "pack_int8",
]

_LOCAL = threading.local()  # `gemm_threads_for`'s count, per Python thread
PLAIN, RMS_NORM, SWIGLU = 0, 1, 2  # the kernel's prologues (`_int8_gemm.linear`)
ACTIVATIONS = {"one": 0, "two": 1, "outliers": 2}
"""How `RowInt8Linear` quantises its rows, and the kernel's number for it: one int8 part (draft
models), two parts (a target's default), or one part plus each row's 16 largest channels in
float32."""
SCALE_COLS = 128
"""The block width of block-scaled int8 weights (`RowInt8Linear.scale_cols`): a scale per output
channel and 128 input columns, as llama.cpp's Q8_0 keeps one per 32 (and GPTQ/AWQ per 128)."""


def gemm_threads() -> int:
    """Threads a `RowInt8Linear` call (and a large enough `tree_attention`) computes on: this
    Python thread's `gemm_threads_for`, else torch's count. A session's forwards run inside its
    model's `ForwardPlan.running`, which sets the thread plan's count."""
    return getattr(_LOCAL, "threads", None) or torch.get_num_threads()


@contextlib.contextmanager
def gemm_threads_for(threads: int | None) -> Iterator[None]:
    """Within the block, this Python thread's kernel calls run on `threads` (None: the count
    of an enclosing block, else torch's). A forward's result does not depend on it (which
    thread computes a tile or a row does not change its bits), only its speed: a session runs
    its model's planned count (`ForwardPlan.running`), and `wmark.generator.cpu.thread_tuner`
    picks one per forward shape from measurement."""
    if threads is not None and threads < 1:
        raise ValueError(f"GEMM threads must be positive, got {threads}")
    before = getattr(_LOCAL, "threads", None)
    _LOCAL.threads = threads if threads is not None else before
    try:
        yield
    finally:
        _LOCAL.threads = before


class RowInt8Linear(nn.Module):
    """Linear layer with int8 weights and per-row int8 activations (batch-invariant).

    Each row is quantised with its own peak (q = round(x * (127 / peak))), the integer products
    are summed exactly, and each sum is scaled by the channel's scale and then by the row's
    peak / 127 (the two float32 multiplications in that order, then the bias), all in one call
    of `_int8_gemm.linear`, on `gemm_threads()`. A row's output is therefore bit for bit the
    same however many rows rode along and whichever build of the kernel ran.

    `activations` ("one" by default; see `ACTIVATIONS`): "two" quantises each row in two parts,
    the row as above and what its int8 value left (the row minus q * peak / 127, quantised with
    its own peak), both multiplied in the same call and their outputs added: activations at ~16
    bits instead of 8, for the weights read once and twice the rows' arithmetic. Qwen2.5's
    activations carry a few channels hundreds of times larger than the rest, and one 8-bit scale
    per row left the others a handful of levels (BENCHMARKS.md, "Quality"). "outliers" takes each
    row's 16 largest channels by magnitude (ties: the lower channel) out of its one int8 part and
    multiplies them in float32, right after each tile of weights has streamed through the cache:
    the output is the one-part output of the rest, plus the bias, plus the float part times the
    channel scale (the float part summed over the row's channels in ascending order). Every mode
    is row-local, so batch-invariant, and gives the same bits in every build.

    Block scales (`scale_cols` > 0, `quantize(..., scale_cols)`): a scale per output channel and
    block of `scale_cols` input columns instead of one per channel, so a block of small weights
    keeps its own 255 levels instead of the row's largest weight's. Each block's integer sum is
    still exact; the kernel scales the blocks' sums and adds them in order (float32), then
    multiplies by the row's scale. What the weights' rounding costs the model falls with it
    (BENCHMARKS.md, "Quality"); the price is a float step per block in the GEMM, and the "amx"
    build runs such layers on its VNNI code.

    The weights are packed for the kernel on first use (`pack`; `pack_int8` does it at load), or
    come packed from the model cache (`from_packed`, memory-mapped: a later load neither packs
    nor copies them).

    Args:
        weight_int8: (out, in) int8 weights.
        scale: float64 scales: (out,) per output channel (weight = weight_int8 * scale), or (out,
            blocks) per channel and block of `scale_cols` input columns.
        bias: (out,) float32 bias or None.
        scale_cols: the block width of a 2-D `scale` (a multiple of 4); None: `SCALE_COLS` for a
            2-D scale, 0 (one scale per channel) for a 1-D one.
    """

    def __init__(
        self,
        weight_int8: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        scale_cols: int | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self._weight: torch.Tensor | None = weight_int8  # until packed: stacking or cutting needs no unpack
        self._packed: torch.Tensor | None = None  # uint8, the kernel's layout
        self._colsum: torch.Tensor | None = None  # int32, each channel's weight sum (padded to 32)
        self.scale = scale.detach().to(torch.float64)
        self.scale_cols = (SCALE_COLS if self.scale.dim() == 2 else 0) if scale_cols is None else scale_cols
        self._check_scale()
        self._scale32 = self._kernel_scales()
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._views: tuple[Any, Any, Any, Any] | None = None  # numpy views of what `linear` reads
        self.activations = "one"  # how rows are quantised (see the class docstring)

    @property
    def blocks(self) -> int:
        """Scale blocks per output channel (1 without block scales)."""
        return -(-self.in_features // self.scale_cols) if self.scale_cols else 1

    def _kernel_scales(self) -> torch.Tensor:
        """The float32 scales as the kernel reads them: (out,), or with blocks (tiles of 32
        channels, blocks, 32), a tile's blocks side by side (zeros past the last channel); one
        block is (out,) as well."""
        if self.blocks == 1:
            return self.scale.float().reshape(-1)
        tiles = -(-self.out_features // 32)
        padded = nn.functional.pad(self.scale.float(), (0, 0, 0, tiles * 32 - self.out_features))
        return padded.reshape(tiles, 32, self.blocks).transpose(1, 2).contiguous()

    def _check_scale(self) -> None:
        if self.scale_cols < 0 or self.scale_cols % 4:
            raise ValueError(f"scale_cols must be 0 or a positive multiple of 4, got {self.scale_cols}")
        shape = (self.out_features, self.blocks) if self.scale_cols else (self.out_features,)
        if tuple(self.scale.shape) != shape:
            raise ValueError(f"scales of shape {tuple(self.scale.shape)} do not fit {shape}")

    @classmethod
    def from_packed(
        cls,
        packed: torch.Tensor,
        colsum: torch.Tensor,
        shape: tuple[int, int],
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        scale_cols: int | None = None,
    ) -> Self:
        """A layer over weights already in the kernel's layout (`packed_weights` of another)."""
        out, inp = shape
        shaped = torch.empty(1, dtype=torch.int8).expand(out, inp)  # the shape, no memory
        layer = cls(shaped, scale, bias, scale_cols)
        if packed.numel() != cls._packed_bytes(out, inp) or colsum.numel() != -(-out // 32) * 32:
            raise ValueError(f"packed weights do not fit a {out} x {inp} layer")
        layer._weight = None
        layer._packed, layer._colsum = packed, colsum
        return layer

    @staticmethod
    def _packed_bytes(out: int, inp: int) -> int:
        """Bytes of the kernel's layout of an (out, inp) layer's weights."""
        return _int8_gemm.packed_size(out, inp)

    @property
    def packed(self) -> bool:
        """Whether the weights are held in the kernel's layout only (after `pack` or a first use)."""
        return self._weight is None

    def packed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed, colsum): the kernel's layout of the weights, packed now if need be."""
        self.pack()
        assert self._packed is not None and self._colsum is not None
        return self._packed, self._colsum

    def pack(self) -> None:
        """Put the weights in the kernel's layout (done on first use; `pack_int8` does it at load).

        Layers that `fuse_projections` stacks are never packed on their own.
        """
        if self._weight is None:
            return
        out, inp = self.out_features, self.in_features
        packed = torch.zeros(_int8_gemm.packed_size(out, inp), dtype=torch.uint8)
        colsum = torch.zeros(-(-out // 32) * 32, dtype=torch.int32)
        _int8_gemm.pack(self._weight.contiguous().numpy(), packed.numpy(), colsum.numpy(), out, inp)
        self._packed, self._colsum, self._weight = packed, colsum, None

    @staticmethod
    def quantize(weight: torch.Tensor, scale_cols: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Symmetric int8: (weight_int8, scale), a scale per output channel, or with `scale_cols`
        per channel and block of that many input columns ((out, blocks) scales; the last block
        may be narrower)."""
        weight = weight.detach().to(torch.float32)
        if not scale_cols:
            scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0).to(torch.float64)
            weight_int8 = torch.clamp(torch.round(weight / scale[:, None]), -127, 127).to(torch.int8)
            return weight_int8, scale
        out, inp = weight.shape
        blocks = -(-inp // scale_cols)
        padded = nn.functional.pad(weight, (0, blocks * scale_cols - inp)).reshape(out, blocks, scale_cols)
        scale = (padded.abs().amax(dim=2).clamp_min(1e-12) / 127.0).to(torch.float64)
        weight_int8 = torch.clamp(torch.round(padded / scale[:, :, None]), -127, 127).to(torch.int8)
        return weight_int8.reshape(out, -1)[:, :inp].contiguous(), scale

    def dequantised(self) -> torch.Tensor:
        """The float64 weights these int8 weights and scales stand for, (out, in)."""
        weight, scale = self.int8_weight()
        if not self.scale_cols:
            return weight.to(torch.float64) * scale[:, None]
        steps = scale.repeat_interleave(self.scale_cols, dim=1)[:, : self.in_features]
        return weight.to(torch.float64) * steps

    def __deepcopy__(self, memo: dict[int, Any]) -> RowInt8Linear:
        weight, scale = self.int8_weight()
        bias = None if self.bias is None else self.bias.detach()
        copy = RowInt8Linear(weight.clone(), scale.clone(), bias, self.scale_cols)
        copy.activations = self.activations
        return copy

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight_int8, scale) as given to the constructor (to stack or cut layers; the block
        width is `scale_cols`)."""
        if self._weight is not None:
            return self._weight, self.scale
        assert self._packed is not None
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.int8)
        _int8_gemm.unpack(self._packed.numpy(), weight.numpy(), self.out_features, self.in_features)
        return weight, self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, self.in_features, PLAIN)

    def rms_forward(self, x: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
        """This layer of RMSNorm(x) * norm, the norm computed inside the kernel call.

        Row-local and deterministic (batch-invariant, as the layer itself), but not torch's
        `rms_norm` bit for bit (`wmark.generator.models.lean_decoder` runs it).
        """
        return self._run(x, self.in_features, RMS_NORM, norm.detach().to(torch.float32).contiguous(), eps)

    def swiglu_forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This layer of silu(gate) * up, where `gate_up` (..., 2 x in_features) holds gate, then up;
        computed inside the kernel call (row-local, as `rms_forward`)."""
        return self._run(gate_up, 2 * self.in_features, SWIGLU)

    def _run(
        self, x: torch.Tensor, width: int, prologue: int, norm: torch.Tensor | None = None, eps: float = 0.0
    ) -> torch.Tensor:
        """The kernel call over the rows of `x` (`width` columns each) after `prologue`."""
        rows = x.reshape(-1, width).to(torch.float32).contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        self.into(
            rows.numpy(), out.numpy(), gemm_threads(), prologue, None if norm is None else norm.numpy(), eps
        )
        return out.reshape(*x.shape[:-1], self.out_features)

    def into(
        self,
        rows: Any,
        out: Any,
        threads: int,
        prologue: int = PLAIN,
        norm: Any = None,
        eps: float = 0.0,
    ) -> None:
        """The bare kernel call: float32 numpy `rows` (m x in_features, or 2 x in_features for
        `SWIGLU`) into `out` (m x out_features). `LeanDecoder`'s few-row forwards call it with
        buffers of their own, where the torch steps around each call cost more than it did."""
        if self._views is None:
            packed, colsum = self.packed_weights()
            bias = None if self.bias is None else self.bias.detach().numpy()
            self._views = (packed.numpy(), colsum.numpy(), self._scale32.numpy(), bias)
        packed_np, colsum_np, scale_np, bias_np = self._views
        self._gemm()(
            rows, packed_np, colsum_np, scale_np, bias_np, out,
            rows.shape[0], self.out_features, self.in_features, threads, prologue, norm, eps,
            ACTIVATIONS[self.activations], self.scale_cols,
        )  # fmt: skip

    def _gemm(self) -> Any:
        """The kernel call for these weights (`_int8_gemm.linear`; 4-bit layers take `linear4`)."""
        return _int8_gemm.linear


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

    Each layer packs on its own with the GIL released, so `workers` threads share the layers
    (`prepare_model` passes torch's thread count: the cores free for this process).
    """
    todo = [layer for layer in layers if not layer.packed]
    if workers <= 1 or len(todo) < 2:
        for layer in todo:
            layer.pack()
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wmark-pack") as pool:
        list(pool.map(RowInt8Linear.pack, todo))  # list(): re-raises a worker's exception here


def convert_linears(
    model: nn.Module, kind: str, int8_weights: Path | None = None, *, scale_cols: int = 0
) -> int:
    """Replace every nn.Linear of `model` by its batch-invariant version; returns how many.

    Args:
        model: the model, modified in place.
        kind: "int8" or "fp32".
        int8_weights: a safetensors file of plain int8 weights (`<name>.q`, `<name>.scale`, as
            `wmark.generator.models.gguf_int8.convert` writes them): layers found there take those,
            the others are quantised from their float weights.
        scale_cols: int8 layers quantised here take block scales of this width (0: per channel),
            and the block width of 2-D scales in `int8_weights`.
    """
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    stored: dict[str, torch.Tensor] = {}
    if kind == "int8" and int8_weights is not None and int8_weights.is_file():
        stored = safetensors.torch.load_file(str(int8_weights))
    for name, module in targets:
        replacement: nn.Module
        if kind == "fp32":
            replacement = RowFloatLinear(module)
        elif f"{name}.q" in stored:
            scale = stored[f"{name}.scale"]
            width = scale_cols if scale.dim() == 2 else 0
            replacement = RowInt8Linear(stored[f"{name}.q"], scale, module.bias, width)
        else:
            weight, scale = RowInt8Linear.quantize(module.weight, scale_cols)
            replacement = RowInt8Linear(weight, scale, module.bias, scale_cols)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
    return len(targets)
