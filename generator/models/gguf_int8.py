"""A GGUF model converted straight into what the int8 precision loads, with no float32 copy.

The float32 route (transformers dequantises the whole GGUF, the result is saved, then quantised
again on the first int8 load) wrote 6.7 GB for a 1.1 GB file and took minutes. `convert` walks the
GGUF one tensor at a time instead:

- the weight of every linear layer is dequantised and at once quantised to int8 per output
  channel by `RowInt8Linear.quantize`, into `int8.safetensors` under the names `convert_linears`
  reads, so these are exactly the numbers the float32 route would produce;
- the token embedding keeps its GGUF encoding (raw blocks, about a tenth of float32) and is
  dequantised row by row as a forward looks tokens up (`GGUFEmbedding`), so its values are exactly
  those of the float32 route too;
- norms and biases (a few MB) are stored as float32 in `dense.safetensors`.

`load` builds the model without initialising its weights and fills it from those files: the
model that `prepare_model(..., "int8")` then returns is bit-identical to the float32 route's.
Only Qwen2-style GGUF files (no tensor reordering in the conversion) are accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from wmark.errors import BackendError
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.models import int8_store
from wmark.generator.models.smoothing import VERSION, Smoothing

__all__ = [
    "DENSE_FILE",
    "INT8_FILE",
    "SMOOTHING_KEY",
    "GGUFEmbedding",
    "convert",
    "has_int8",
    "load",
    "skeleton",
    "smoothing_version",
]

INT8_FILE = "int8.safetensors"
DENSE_FILE = "dense.safetensors"
_CONVERTIBLE = frozenset({"qwen2"})  # model types whose GGUF tensors map to HF ones unchanged
SMOOTHING_KEY = "wmark-smoothing"
"""`dense.safetensors` metadata: the `smoothing.VERSION` the conversion applied, or "none"."""


def has_int8(path: Path) -> bool:
    """Whether `path` holds a converted model (config, int8 linears and dense tensors)."""
    return all((path / name).is_file() for name in ("config.json", INT8_FILE, DENSE_FILE))


def skeleton(config: object, *, meta: bool) -> PreTrainedModel:
    """The model with uninitialised weights: on the meta device, or as untouched CPU memory."""
    from transformers.initialization import no_init_weights

    if meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with no_init_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _linear_names(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def smoothing_version(path: Path) -> str | None:
    """The smoothing a converted directory's weights carry (`SMOOTHING_KEY`), None if unknown."""
    try:
        with safe_open(str(path / DENSE_FILE), framework="pt") as f:
            return (f.metadata() or {}).get(SMOOTHING_KEY)
    except (OSError, ValueError, safetensors.SafetensorError):
        return None


def _quantize_rows(
    data: np.ndarray, qtype: Any, name: str, smoothing: Smoothing | None, scale_cols: int, chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """`RowInt8Linear.quantize` of linear layer `name`'s GGUF weight (smoothed first where
    `smoothing` says; block scales of `scale_cols` columns, if not 0), `chunk` rows at a time.

    Every step is row-local, so the result equals treating the whole float32 matrix, while
    memory holds one chunk's float32 and float64 temporaries instead of the whole matrix's (the
    target's output layer alone is 0.9 GB in float32).
    """
    from gguf import dequantize

    def rows(i: int) -> torch.Tensor:
        weight = torch.from_numpy(np.array(dequantize(data[i : i + chunk], qtype), dtype=np.float32))
        return weight if smoothing is None else smoothing.weight(name, weight, first_row=i)

    parts = [RowInt8Linear.quantize(rows(i), scale_cols) for i in range(0, len(data), chunk)]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def convert(
    gguf: Path,
    out: Path,
    progress: Callable[[int, int], None] | None = None,
    *,
    calibration: Sequence[Sequence[int]] | None = None,
    scale_cols: int = 0,
) -> None:
    """Write config, generation config, `int8.safetensors` and `dense.safetensors` into `out`.

    Args:
        gguf: the (verified) GGUF file.
        out: an existing directory (the caller moves its files into the cache).
        progress: called as progress(tensors done, tensors total).
        calibration: token IDs of the calibration text (`smoothing.calibration_ids`): the
            weights are smoothed for int8 activations (`wmark.generator.models.smoothing`),
            measured without a float32 copy (`gguf_calibration`). None: not smoothed.
        scale_cols: the linear layers' int8 weights take a scale per channel and block of this
            many input columns (`RowInt8Linear.quantize`); 0: one per channel.
    """
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if config.model_type not in _CONVERTIBLE:
        raise BackendError(f"no direct int8 conversion for {config.model_type} GGUF files")
    shape = skeleton(config, meta=True)
    gguf_to_hf = get_gguf_hf_weights_map(shape, TensorProcessor())
    linears = _linear_names(shape)
    embedding = next(n for n, p in shape.named_parameters() if p is shape.get_input_embeddings().weight)
    int8: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    encodings: dict[str, str] = {}
    reader = GGUFReader(gguf)
    by_name: dict[str, Any] = {}
    for tensor in reader.tensors:
        name = gguf_to_hf.get(tensor.name)
        if name is None:
            raise BackendError(f"GGUF tensor {tensor.name} has no place in a {config.model_type} model")
        by_name[name] = tensor
    missing = {n for n, _ in shape.named_parameters()} - set(by_name)
    if missing:
        raise BackendError(f"the GGUF file lacks {len(missing)} tensors, e.g. {sorted(missing)[0]}")
    smoothing = None
    if calibration is not None:
        from wmark.generator.models.gguf_calibration import smoothing_of

        smoothing = smoothing_of(by_name, config, calibration)
    for done, (name, tensor) in enumerate(by_name.items(), start=1):
        module, _, kind = name.rpartition(".")
        if name == embedding:
            dense[name] = torch.from_numpy(np.array(tensor.data))  # a copy: the file is mapped read-only
            encodings[name] = tensor.tensor_type.name
        elif module in linears and kind == "weight":
            int8[f"{module}.q"], int8[f"{module}.scale"] = _quantize_rows(
                tensor.data, tensor.tensor_type, module, smoothing, scale_cols
            )
        else:
            value = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
            dense[name] = value if smoothing is None else smoothing.tensor(name, value)
        if progress:
            progress(done, len(reader.tensors))
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    safetensors.torch.save_file(int8, str(out / INT8_FILE))
    encodings[SMOOTHING_KEY] = "none" if smoothing is None else VERSION
    safetensors.torch.save_file(dense, str(out / DENSE_FILE), metadata=encodings)


CACHED_ROWS = 8192
"""Dequantised embedding rows a `GGUFEmbedding` keeps (~50 MB for the 1.5B target's 1536 floats)."""


class GGUFEmbedding(nn.Module):
    """A token embedding kept in its GGUF encoding; looked-up rows are dequantised on the way.

    GGUF's block formats are row-local (a row is whole blocks), so a row dequantised alone equals
    that row of the dequantised matrix bit for bit: the model computes what it computed with the
    float32 table, which took seconds of every load to build and over a gigabyte of memory for
    the embedded pair (151,936 rows of 1536 and 896 floats). Dequantising a forward's few rows
    through the gguf package has its cost too (BENCHMARKS.md, "Kernels"), so rows once
    dequantised are kept (up to `CACHED_ROWS`,
    then the keep starts over): text repeats its tokens, and a decoding step looks up one or a
    few rows.

    Args:
        raw: (vocab, bytes per row) uint8, the tensor as the GGUF file stores it.
        encoding: its `GGMLQuantizationType` name (e.g. "Q4_K").
        config: the model's config (for the hidden size).
    """

    def __init__(self, raw: torch.Tensor, encoding: str, config: Any) -> None:
        from gguf import GGMLQuantizationType

        super().__init__()
        self.raw = raw.numpy()
        self.encoding = GGMLQuantizationType[encoding]
        self.num_embeddings, self.embedding_dim = len(self.raw), int(config.hidden_size)
        self._rows: dict[int, np.ndarray] = {}  # token ID -> its dequantised row

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from gguf import dequantize

        ids = input_ids.reshape(-1).cpu().tolist()
        missing = sorted({i for i in ids if i not in self._rows})
        if missing:
            if len(self._rows) + len(missing) > CACHED_ROWS:
                self._rows.clear()
                missing = sorted(set(ids))
            values = np.asarray(dequantize(self.raw[missing], self.encoding), dtype=np.float32)
            self._rows.update(zip(missing, values.reshape(len(missing), self.embedding_dim), strict=True))
        out = np.stack([self._rows[i] for i in ids]) if ids else np.empty((0, self.embedding_dim), np.float32)
        return torch.from_numpy(out).reshape(*input_ids.shape, self.embedding_dim)


def load(path: Path) -> PreTrainedModel:
    """The model of a converted directory, float32 except its linear layers' weights.

    Those weights are left uninitialised (never touched, so never in memory): pass
    `int8_cache=path / INT8_FILE` to `prepare_model(..., "int8")`, which replaces every linear
    layer from that file (and, the first time, rewrites it in the GEMM kernel's packed layout:
    `wmark.generator.models.int8_store`).
    """
    model = skeleton(AutoConfig.from_pretrained(str(path)), meta=False)
    if not int8_store.is_packed(path / INT8_FILE):  # (a packed cache is checked as it is read)
        with safe_open(str(path / INT8_FILE), framework="pt") as f:
            cached = set(f.keys())
        absent = [m for m in sorted(_linear_names(model)) if f"{m}.q" not in cached]
        if absent:
            raise BackendError(f"{path / INT8_FILE} lacks {absent[0]}: delete {path} to rebuild it")
    tensors: dict[str, torch.Tensor] = {}
    embedding = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    with safe_open(str(path / DENSE_FILE), framework="pt") as f:
        encodings = f.metadata() or {}
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            tensors[name] = f.get_tensor(name)
    if set(encodings) - {"format", SMOOTHING_KEY} - {embedding} or embedding not in tensors:
        raise BackendError(f"{path / DENSE_FILE} does not match the model: delete {path} to rebuild it")
    if embedding in encodings:  # kept encoded: rows are dequantised when looked up
        model.set_input_embeddings(GGUFEmbedding(tensors.pop(embedding), encodings[embedding], model.config))
    result = model.load_state_dict(tensors, strict=False, assign=True)
    expected = {f"{m}.weight" for m in _linear_names(model)}
    if result.unexpected_keys or not set(result.missing_keys) <= expected:
        raise BackendError(f"{path / DENSE_FILE} does not match the model: delete {path} to rebuild it")
    return model
