"""4-bit weights for a draft model: half the bytes a drafter forward reads.

A drafter forward on CPU is memory-bound (its int8 weights stream from memory once per
forward), and the drafter only proposes: its numbers never reach the text, so it needs neither
exactness against the target nor 8-bit weights. `cut_to_int4` re-quantises each int8 layer of a
drafter to 4 bits per weight (symmetric, a scale per output channel: the int8 weights divided by
the channel's peak / 7, rounded, in [-8, 7]), and `RowInt4Linear` runs them through the int8
GEMM's `linear4` (activations stay 8-bit, sums exact). Which drafts come out changes a little,
so AATPS may move; the text cannot (the target's race picks every token).

Only CPUs where `linear4` is vectorised (AVX-512 VNNI, AMX) take it: `int4_pays()`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from wmark.generator.cpu import _int8_gemm
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.models.fused import replace_int8_layers

__all__ = ["RowInt4Linear", "cut_to_int4", "int4_pays"]

_VECTOR_BUILDS = ("avx512vnni", "amx")


def int4_pays() -> bool:
    """Whether this CPU runs 4-bit weights vectorised (elsewhere `linear4` is portable C)."""
    return _int8_gemm.backend() in _VECTOR_BUILDS


class RowInt4Linear(RowInt8Linear):
    """A `RowInt8Linear` whose weights are 4-bit (W4A8), made by `from_int8`.

    Packed like the int8 layout at half the bytes: in each 64-byte group, byte j holds the 8-bit
    layout's byte j in its low nibble and byte 64 + j in its high one, each plus 8.
    """

    @classmethod
    def from_int8(cls, layer: RowInt8Linear) -> RowInt4Linear:
        """`layer`'s weights re-quantised to 4 bits per output channel (its bias kept)."""
        if layer.scale_cols:
            raise ValueError("4-bit weights are made from int8 weights with a scale per channel")
        packed8, _ = layer.packed_weights()
        out, inp = layer.out_features, layer.in_features
        packed = torch.empty(packed8.numel() // 2, dtype=torch.uint8)
        colsum = torch.empty(-(-out // 32) * 32, dtype=torch.int32)
        step = torch.empty(colsum.numel(), dtype=torch.float32)  # int8 units per 4-bit unit
        _int8_gemm.pack4(packed8.numpy(), packed.numpy(), colsum.numpy(), step.numpy(), out, inp)
        scale = layer.scale * step[:out].to(torch.float64)
        bias = None if layer.bias is None else layer.bias.detach()
        return cls.from_packed(packed, colsum, (out, inp), scale, bias)

    @staticmethod
    def _packed_bytes(out: int, inp: int) -> int:
        return _int8_gemm.packed_size(out, inp) // 2

    def __deepcopy__(self, memo: dict[int, Any]) -> RowInt4Linear:
        packed, colsum = self.packed_weights()
        bias = None if self.bias is None else self.bias.detach().clone()
        shape = (self.out_features, self.in_features)
        return type(self).from_packed(packed.clone(), colsum.clone(), shape, self.scale.clone(), bias)

    def int8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the 4-bit weights as int8, scale): the same layer on the int8 kernel."""
        packed, _ = self.packed_weights()
        pairs = packed.reshape(-1, 64)
        low = (pairs & 15).to(torch.int16) - 8
        high = (pairs >> 4).to(torch.int16) - 8
        packed8 = torch.cat([low, high], dim=1).to(torch.int8).view(torch.uint8).reshape(-1)
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.int8)
        _int8_gemm.unpack(packed8.numpy(), weight.numpy(), self.out_features, self.in_features)
        return weight, self.scale

    def _gemm(self) -> Any:
        return _int8_gemm.linear4


def cut_to_int4(model: nn.Module) -> int:
    """Replace every int8 layer of `model` (a drafter; in place) by its 4-bit form, fused groups'
    included; returns how many were cut. Layers already 4-bit are left alone."""
    return replace_int8_layers(
        model, lambda layer: RowInt4Linear.from_int8(layer) if type(layer) is RowInt8Linear else None
    )
