"""Fused int8 projections: q/k/v and gate/up as one GEMM each, with bit-identical outputs.

A transformers decoder layer calls `q_proj`, `k_proj` and `v_proj` on the same hidden state,
then `gate_proj` and `up_proj` on the same one. With `RowInt8Linear` each call quantises the
activations again and runs its own GEMM; at the 1-9 rows of a speculative block the calls'
fixed costs (quantising the rows, dispatch) are a good part of a small model's forward.
`fuse_projections` stacks the int8 weights of such a group into one `RowInt8Linear` and gives
each member a `_Slice` of its output: the first member called computes the whole group once,
the others take their columns from it.

Why the numbers do not change: weights are int8 per output channel, activations are quantised
per row with the row's own peak (identical in every member), integer accumulation is exact in
any order, and each output column is then scaled by its own channel's scale and the row's
peak. Stacking output channels changes none of these per-column operations, so each member's
output is bit for bit what its own layer gave (tests/unit/generator/test_fused.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import torch
from torch import nn

from wmark.generator.cpu.rowwise import RowInt8Linear

__all__ = [
    "GROUPS",
    "FusedGroup",
    "fuse_projections",
    "group_name",
    "install_group",
    "int8_layers",
    "replace_int8_layers",
    "stacked_layer",
]

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling layers that read the same input in a Qwen2 / Llama decoder layer."""


def group_name(parent: str, names: tuple[str, ...]) -> str:
    """How a fused group is named in the model cache: its module's path and members, e.g.
    `model.layers.0.self_attn.q_proj+k_proj+v_proj`."""
    members = "+".join(names)
    return f"{parent}.{members}" if parent else members


def stack(layers: list[RowInt8Linear]) -> RowInt8Linear:
    """One layer over `layers`' output channels side by side (their biases too, zeros where a
    member has none)."""
    widths = {layer.scale_cols for layer in layers}
    if len(widths) != 1:
        raise ValueError(f"layers with different scale blocks cannot be stacked: {sorted(widths)}")
    parts = [layer.int8_weight() for layer in layers]
    weight = torch.cat([w for w, _ in parts])
    scale = torch.cat([s for _, s in parts])
    return RowInt8Linear(weight, scale, stacked_bias(layers), widths.pop())


def stacked_bias(layers: Sequence[nn.Module]) -> torch.Tensor | None:
    """The members' biases side by side, or None if none has one."""
    biases = [getattr(layer, "bias", None) for layer in layers]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [
            b.detach().float() if b is not None else torch.zeros(int(getattr(layer, "out_features")))  # noqa: B009
            for b, layer in zip(biases, layers, strict=True)
        ]
    )


class FusedGroup:
    """One `RowInt8Linear` over the stacked output channels of a group, and its last result.

    Holds the input it last saw (by identity): the members of a group are called one after the
    other on the same tensor, so the second and third calls reuse the first call's output.
    The result is dropped once every member has taken its part, so no tensor outlives a forward.
    """

    def __init__(self, linear: RowInt8Linear, members: int) -> None:
        self.linear = linear  # not a submodule: see `int8_layers`
        self.members = members
        # (input, output) of the last call, swapped as one tuple: a forward on another thread can
        # only replace it, never pair one call's input with another's output.
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self._taken = 0

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """The stacked output for `x`: computed on the first member's call, reused after."""
        last = self._last
        if last is not None and last[0] is x:
            out = last[1]
            self._taken += 1
        else:
            out = self.linear(x)
            self._last, self._taken = (x, out), 1
        if self._taken >= self.members:  # every member has its part: release the tensors
            self._last = None
        return out


class _Slice(nn.Module):
    """A group member: its own columns [start, stop) of the group's output."""

    def __init__(self, group: FusedGroup, start: int, stop: int, in_features: int) -> None:
        super().__init__()
        self.group = group
        self.start, self.stop = start, stop
        self.in_features, self.out_features = in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x)[..., self.start : self.stop]


def install_group(module: nn.Module, names: tuple[str, ...], sizes: list[int], linear: RowInt8Linear) -> None:
    """Make `module`'s layers `names` (of `sizes` output channels, in order) slices of `linear`."""
    group = FusedGroup(linear, len(names))
    start = 0
    for name, size in zip(names, sizes, strict=True):
        setattr(module, name, _Slice(group, start, start + size, linear.in_features))
        start += size


def fuse_projections(model: nn.Module) -> int:
    """Fuse every q/k/v and gate/up group of int8 layers in `model` (in place); returns how many.

    Groups whose members are not all `RowInt8Linear` over the same input width and scale blocks
    are left alone.
    """
    fused = 0
    for module in list(model.modules()):
        for names in GROUPS:
            layers = [getattr(module, name, None) for name in names]
            members = [layer for layer in layers if isinstance(layer, RowInt8Linear)]
            if len(members) != len(names) or len({(m.in_features, m.scale_cols) for m in members}) != 1:
                continue
            install_group(module, names, [layer.out_features for layer in members], stack(members))
            fused += 1
    return fused


def int8_layers(model: nn.Module) -> list[RowInt8Linear]:
    """Every `RowInt8Linear` that `model`'s forward runs: its own and its fused groups' (which are
    no submodules: the group is shared by its members' `_Slice`s), each once."""
    found: dict[int, RowInt8Linear] = {}
    for module in model.modules():
        layer = module.group.linear if isinstance(module, _Slice) else module
        if isinstance(layer, RowInt8Linear):
            found.setdefault(id(layer), layer)
    return list(found.values())


def replace_int8_layers(model: nn.Module, convert: Callable[[RowInt8Linear], RowInt8Linear | None]) -> int:
    """Put `convert(layer)` in place of each `RowInt8Linear` that `model`'s forward runs, its own
    and its fused groups', where `convert` gives one (None: keep the layer); returns how many."""
    replaced = 0
    for module in list(model.modules()):
        if isinstance(module, _Slice):
            if (new := convert(module.group.linear)) is not None:
                module.group.linear = new
                replaced += 1
            continue
        for name, child in list(module.named_children()):
            if isinstance(child, RowInt8Linear) and (new := convert(child)) is not None:
                setattr(module, name, new)
                replaced += 1
    return replaced


def stacked_layer(members: list[nn.Module]) -> RowInt8Linear | None:
    """The one layer whose output is `members`' outputs side by side, in this order, if they
    are exactly one fused group (None otherwise): a caller that wants them all calls it once."""
    slices = [m for m in members if isinstance(m, _Slice)]
    if not slices or len(slices) != len(members):
        return None
    group = slices[0].group
    bounds = [(m.start, m.stop) for m in slices if m.group is group]
    if len(bounds) != len(members) or len(members) != group.members or bounds[0][0] != 0:
        return None
    if any(a[1] != b[0] for a, b in pairwise(bounds)) or bounds[-1][1] != group.linear.out_features:
        return None
    return group.linear
