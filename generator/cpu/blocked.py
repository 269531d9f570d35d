"""An int8 layer whose input is quantised in column blocks, each block with its own per-row scale.

Why: `RowInt8Linear` quantises a whole input row with one scale, its peak. The MLP's down
projection reads silu(gate) * up, 8,960 channels wide in the embedded target, whose peak in a
row is often tens of times its typical value: one scale leaves most channels a few levels, and
on the embedded target that was most of the int8 model's distance to the float one even after
smoothing (BENCHMARKS.md, "Quality"). Cutting the row into blocks of `BLOCK` channels gives each
block its own scale, at no cost in bytes read: the blocks are column slices of the same int8
weights (same per-output-channel scales), each one kernel call, and the calls' outputs are
added in block order.

Every step is row-local and in a fixed order, so a row's output still depends on that row alone
(batch invariance) and on no build of the kernel.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch
from torch import nn

from wmark.generator.cpu.rowwise import PLAIN, SWIGLU, RowInt8Linear, gemm_threads

__all__ = ["BLOCK", "BlockedInt8Linear", "block_down_projections"]

BLOCK = 1280
"""Input channels per block: a multiple of 64 (the kernel's group) that cuts the embedded
target's width evenly (8,960 = 7 x 1,280); chosen by measurement (BENCHMARKS.md, "Quality")."""


def _widths(in_features: int, block: int) -> list[int]:
    full, rest = divmod(in_features, block)
    return [block] * full + ([rest] if rest else [])


class BlockedInt8Linear(nn.Module):
    """`RowInt8Linear` over column blocks (see the module docstring); made by `split`.

    Only the plain and SwiGLU prologues are supported: the down projection's (an RMSNorm's peak
    is the whole row's, which blocks would not see).
    """

    def __init__(self, blocks: list[RowInt8Linear], bias: torch.Tensor | None) -> None:
        super().__init__()
        if len({b.out_features for b in blocks}) != 1 or any(b.bias is not None for b in blocks):
            raise ValueError("blocks must share the output width and carry no bias")
        self.blocks = nn.ModuleList(blocks)
        self.out_features = blocks[0].out_features
        self.in_features = sum(b.in_features for b in blocks)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def split(cls, layer: RowInt8Linear, block: int = BLOCK) -> BlockedInt8Linear:
        """`layer`'s int8 weights cut into blocks of `block` input channels (its scales and bias
        kept): the same weights, each block's input quantised on its own."""
        weight, scale = layer.int8_weight()
        blocks, start = [], 0
        for width in _widths(layer.in_features, block):
            blocks.append(RowInt8Linear(weight[:, start : start + width].contiguous(), scale.clone(), None))
            start += width
        return cls(blocks, None if layer.bias is None else layer.bias.detach())

    @property
    def parts(self) -> list[RowInt8Linear]:
        """The blocks, in input order (read each call: cutting to 4 bits replaces them)."""
        return [cast(RowInt8Linear, b) for b in self.blocks]

    @property
    def widths(self) -> list[int]:
        return [b.in_features for b in self.parts]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, self.in_features, PLAIN)

    def swiglu_forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up times the weights, where `gate_up` (..., 2 x in_features) holds gate,
        then up (as `RowInt8Linear.swiglu_forward`)."""
        return self._run(gate_up, 2 * self.in_features, SWIGLU)

    def _run(self, x: torch.Tensor, width: int, prologue: int) -> torch.Tensor:
        rows = x.reshape(-1, width).to(torch.float32).contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        self.into(rows.numpy(), out.numpy(), gemm_threads(), prologue)
        return out.reshape(*x.shape[:-1], self.out_features)

    def into(self, rows: Any, out: Any, threads: int, prologue: int = PLAIN) -> None:
        """The kernel calls, block by block, over float32 numpy `rows` (m x in_features, or m x 2
        in_features for `SWIGLU`: gate, then up) into `out` (m x out_features)."""
        if prologue not in (PLAIN, SWIGLU):
            raise ValueError("a blocked int8 layer runs the plain and SwiGLU prologues only")
        part = np.empty_like(out)
        start = 0
        for i, block in enumerate(self.parts):
            end = start + block.in_features
            if prologue == SWIGLU:
                gate_up = np.concatenate(
                    (rows[:, start:end], rows[:, self.in_features + start : self.in_features + end]), axis=1
                )
            else:
                gate_up = np.ascontiguousarray(rows[:, start:end])
            block.into(gate_up, out if i == 0 else part, threads, prologue)
            if i:
                np.add(out, part, out=out)
            start = end
        if self.bias is not None:
            np.add(out, self.bias.detach().numpy(), out=out)

    def merged(self) -> RowInt8Linear:
        """The same weights as one `RowInt8Linear` (one scale per input row again)."""
        weights = [b.int8_weight()[0] for b in self.parts]
        bias = None if self.bias is None else self.bias.detach()
        return RowInt8Linear(torch.cat(weights, dim=1), self.parts[0].int8_weight()[1], bias)


def block_down_projections(model: nn.Module, block: int | None = None) -> int:
    """Put a `BlockedInt8Linear` in place of each MLP's int8 down projection (`mlp.down_proj`)
    wider than `block` (None: `BLOCK`) (in place, before packing); returns how many."""
    block = block or BLOCK
    done = 0
    for module in model.modules():
        down = getattr(module, "down_proj", None)
        if type(down) is RowInt8Linear and down.in_features > block:
            module.down_proj = BlockedInt8Linear.split(down, block)
            done += 1
    return done
