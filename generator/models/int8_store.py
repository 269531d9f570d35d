"""The int8 model cache in the GEMM kernel's layout: packed once, memory-mapped by every later load.

A model's int8 layers are stored after fusing (`wmark.generator.models.fused`), each as the kernel's
packed weights (`<name>.packed`, uint8), its channels' weight sums (`<name>.colsum`, int32) and
its channel scales (`<name>.scale`, float64; (channels, blocks) with block scales, whose width is
the file's `scale-cols` metadata), where `<name>` is the layer's module path or its
fused group's name (`fused.group_name`). Biases stay with the model (its dense weights).

Why this layout on disk: a load used to read the int8 weights into fresh memory, stack the
fused projections and pack them for the GEMM (seconds for the embedded pair, most of it page
faults on fresh memory and packing: docs/benchmarks-history.md). Loading this file maps it:
safetensors hands out tensors over the file's pages, so no weight is copied or repacked, and
the pages come from the OS page cache, shared by every process that loads the same model.

The file is written by `save` at the first int8 load (from the plain `.q`/`.scale` weights
that the GGUF conversion or a quantised checkpoint gives) and replaces them: the cache holds the
weights once. Its metadata names the format; a file of another format is not read as this one.

Where the int8 weights were smoothed on that load (`wmark.generator.models.smoothing`, a float
checkpoint's route), the float tensors the smoothing divided (norm weights, value biases) were
changed too, and a later load starts again from the checkpoint's: the file keeps those divisors
(`<parameter>.divisor`, float64), and `load` divides the model's tensors by them as the first load
did. (A GGUF conversion's smoothed norms and biases are in its own dense file: no divisors.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import safetensors.torch
import torch
from safetensors import safe_open
from torch import nn

from wmark.errors import BackendError
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.models.fused import GROUPS, group_name, install_group, stacked_bias, stacked_layer

__all__ = ["FORMAT", "is_packed", "is_stale", "load", "save"]

_DIVISOR = ".divisor"
_SCALE_COLS = "scale-cols"
"""Metadata: the block width of the layers' 2-D scales (`RowInt8Linear.scale_cols`), "0" for none."""

FORMAT = "wmark-int8-packed/3"
"""The `format` metadata of a packed cache (bump it when the kernel's layout changes)."""


def is_stale(path: Path) -> bool:
    """Whether `path` is a packed int8 cache of an older format (to be built again, not read)."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            found = (f.metadata() or {}).get("format")
    except (OSError, ValueError, safetensors.SafetensorError):
        return False
    return found is not None and found.startswith("wmark-int8-packed/") and found != FORMAT


def is_packed(path: Path) -> bool:
    """Whether `path` is a packed int8 cache of this format."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except (OSError, ValueError, safetensors.SafetensorError):
        return False


def _stored_layers(model: nn.Module) -> Iterator[tuple[str, RowInt8Linear]]:
    """(name in the cache, layer) of every int8 layer `model`'s forward runs."""
    for parent, module in model.named_modules():
        if isinstance(module, RowInt8Linear):
            yield parent, module
        for names in GROUPS:
            members = [m for m in (getattr(module, name, None) for name in names) if isinstance(m, nn.Module)]
            stacked = stacked_layer(members) if len(members) == len(names) else None
            if stacked is not None:
                yield group_name(parent, names), stacked


def save(model: nn.Module, path: Path, *, divisors: Mapping[str, torch.Tensor] | None = None) -> None:
    """Write `model`'s int8 layers (packed now if need be) to `path`, replacing what is there,
    with the smoothing `divisors` of its float tensors (parameter name -> divisor), if any.

    The file appears whole or not at all (written aside, then renamed), so a load running at
    the same time reads either the old file or this one.
    """
    tensors: dict[str, torch.Tensor] = {
        f"{name}{_DIVISOR}": divisor.to(torch.float64).contiguous()
        for name, divisor in (divisors or {}).items()
    }
    widths: set[int] = set()
    for name, layer in _stored_layers(model):
        widths.add(layer.scale_cols)
        packed, colsum = layer.packed_weights()
        tensors[f"{name}.packed"], tensors[f"{name}.colsum"] = packed, colsum
        tensors[f"{name}.scale"] = layer.scale
    if len(widths) > 1:
        raise ValueError(f"one cache holds one scale block width, not {sorted(widths)}")
    width = widths.pop() if widths else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        safetensors.torch.save_file(tensors, partial, metadata={"format": FORMAT, _SCALE_COLS: str(width)})
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def _map_in(tensors: Iterable[torch.Tensor]) -> None:
    """Fault the mapped pages in now (reading a byte of each 4 KB), so that the first forward
    does not pay for it (the time it takes: BENCHMARKS.md, "Kernels")."""
    for tensor in tensors:
        if tensor.numel():
            tensor.view(-1)[::4096].sum()


def load(model: nn.Module, path: Path) -> None:
    """Replace every `nn.Linear` of `model` by its int8 layer from the packed cache at `path`,
    fused groups included (the weights stay memory-mapped), after dividing the float tensors
    the smoothing divided (norm weights, biases) by the divisors stored with them.

    Raises:
        BackendError: the file lacks a layer of the model or does not fit its shape.
    """
    with safe_open(str(path), framework="pt") as f:
        stored = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a mapping
        width = int((f.metadata() or {}).get(_SCALE_COLS, "0"))
    _map_in(stored.values())
    params = dict(model.named_parameters())
    for key in [k for k in stored if k.endswith(_DIVISOR)]:
        name = key.removesuffix(_DIVISOR)
        if name not in params or params[name].shape != stored[key].shape:
            raise BackendError(f"{path} does not fit the model at {name}: delete it to rebuild")
        param = params[name]
        param.data = (param.detach().to(torch.float64) / stored.pop(key)).to(torch.float32)

    def layer(name: str, members: list[nn.Linear]) -> RowInt8Linear:
        if f"{name}.packed" not in stored:
            raise BackendError(f"{path} lacks {name}: delete it to rebuild the cache")
        shape = (sum(m.out_features for m in members), members[0].in_features)
        try:
            return RowInt8Linear.from_packed(
                stored[f"{name}.packed"],
                stored[f"{name}.colsum"],
                shape,
                stored[f"{name}.scale"],
                stacked_bias(list(members)),
                width,
            )
        except (KeyError, ValueError) as exc:
            raise BackendError(
                f"{path} does not fit the model at {name} ({exc}): delete it to rebuild"
            ) from None

    for parent, module in list(model.named_modules()):
        for names in GROUPS:
            members = [getattr(module, name, None) for name in names]
            if (
                all(isinstance(m, nn.Linear) for m in members)
                and f"{group_name(parent, names)}.packed" in stored
            ):
                linears = [m for m in members if isinstance(m, nn.Linear)]
                install_group(
                    module,
                    names,
                    [m.out_features for m in linears],
                    layer(group_name(parent, names), linears),
                )

    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, layer(name, [module]))
