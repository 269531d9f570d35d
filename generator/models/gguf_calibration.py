"""The activation smoothing of a GGUF model, measured without a float32 copy of it.

`wmark.generator.models.smoothing` needs one float forward over the calibration text to learn
each linear layer's input peaks. The GGUF conversion (`gguf_int8.convert`) never holds the
float32 model (6 GB for the embedded target), so here its linear layers are `DequantisingLinear`:
each dequantises its GGUF weight when called and lets it go, and the forward holds one layer's
float weights at a time. The numbers are those of the float32 route (transformers' own
dequantisation, then the same forward): both routes smooth, hence quantise, bit for bit alike
(tests/integration/generator/test_gguf_int8.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from wmark.generator.models.gguf_int8 import GGUFEmbedding, skeleton
from wmark.generator.models.smoothing import Smoothing, measure

__all__ = ["DequantisingLinear", "smoothing_of"]

_CHUNK_ROWS = 4096  # rows dequantised at a time for a column peak (the output layer is 151,936)


class DequantisingLinear(nn.Module):
    """A linear layer over a GGUF tensor, dequantised at each call (calibration only: slow)."""

    def __init__(self, data: np.ndarray, qtype: Any, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.data, self.qtype, self.bias = data, qtype, bias

    def _dense(self, rows: slice = slice(None)) -> torch.Tensor:
        from gguf import dequantize

        return torch.from_numpy(np.array(dequantize(self.data[rows], self.qtype), dtype=np.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self._dense(), self.bias)

    def column_peaks(self) -> torch.Tensor:
        """max |weight| per input channel, a chunk of rows at a time."""
        peaks = [
            self._dense(slice(i, i + _CHUNK_ROWS)).abs().amax(dim=0)
            for i in range(0, len(self.data), _CHUNK_ROWS)
        ]
        return torch.stack(peaks).amax(dim=0)


def smoothing_of(
    tensors: Mapping[str, Any], config: Any, calibration: Sequence[Sequence[int]]
) -> Smoothing | None:
    """The smoothing of the model whose GGUF tensors are `tensors` (HF name -> the reader's
    tensor), measured on `calibration`; None where the layout is not one smoothing knows."""
    from gguf import dequantize

    model: Any = skeleton(config, meta=False)
    embedding = model.get_input_embeddings()
    dense: dict[str, torch.Tensor] = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            weight = tensors[f"{name}.weight"]
            bias = tensors.get(f"{name}.bias")
            bias_t = None if bias is None else _float(dequantize(bias.data, bias.tensor_type))
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    DequantisingLinear(weight.data, weight.tensor_type, bias_t))  # fmt: skip
        elif module is embedding:
            raw = tensors[f"{name}.weight"]
            model.set_input_embeddings(
                GGUFEmbedding(torch.from_numpy(np.array(raw.data)), raw.tensor_type.name, config)
            )
    for name, _ in model.named_parameters():
        dense[name] = _float(dequantize(tensors[name].data, tensors[name].tensor_type))
    model.load_state_dict(dense, strict=False, assign=True)
    peaks = measure(
        model.eval(),
        calibration,
        kinds=(DequantisingLinear,),
        column_peaks=lambda _name, layer: cast(DequantisingLinear, layer).column_peaks(),
    )
    return Smoothing.plan(peaks, config)


def _float(values: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(values, dtype=np.float32))
