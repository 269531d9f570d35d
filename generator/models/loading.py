"""Load a target/drafter pair (embedded by default, or any local HF model) and its tokenizer.

`load_pair` checks what must hold for speculative decoding to be exact: the two models share
the tokenizer (same vocabulary, same token IDs) and the drafter's logits are not wider than the
target's. Text is encoded and decoded with the model's tokenizer.json itself (the bytes a key
is bound to, exactly what the detector uses); transformers' tokenizer class only renders the
chat template, and `prompt_encoder` maps its control tokens to their IDs, and only its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from wmark.errors import BackendError, InputError
from wmark.generator.cpu.rowwise import SCALE_COLS
from wmark.generator.cpu.threads import ThreadPlan, apply_threads, plan_threads
from wmark.generator.models import gguf_int8, int8_store
from wmark.generator.models.embedded import DRAFTER, TARGET, Weights, models_dir, prepare
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import PRECISIONS, cpu_precision, prepare_model
from wmark.generator.models.prompt_encoder import PromptEncoder
from wmark.generator.models.smoothing import VERSION as SMOOTHING
from wmark.generator.models.smoothing import calibration_ids
from wmark.generator.models.static_forward import StaticPlan

__all__ = ["ModelPair", "load_pair", "resolve_source", "static_plan"]

Progress = Callable[[str], None]


def resolve_source(source: str, role: str, precision: str = "fp32", *, scale_cols: int = 0) -> Path | str:
    """'embedded' -> the cached embedded model directory; anything else is passed to transformers.

    The embedded directory holds what `precision` loads: the int8 cache for "int8" (with block
    scales where `scale_cols` asks: `prepare`'s "int8-blocks"), else a float32 checkpoint for
    `from_pretrained` (built on first use; the int8 path never needs it).
    """
    if source == "embedded":
        weights: Weights = "float32"
        if precision == "int8":
            weights = "int8-blocks" if scale_cols else "int8"
        return prepare(TARGET if role == "target" else DRAFTER, weights=weights)
    return source


def _load_tokenizer(source: Path | str) -> tuple[PreTrainedTokenizerBase, bytes]:
    """transformers' tokenizer (for the chat template) and the tokenizer.json bytes (for IDs)."""
    try:
        hf = AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load a tokenizer from {source}: {exc}") from exc
    path = Path(source) / "tokenizer.json"
    if path.is_file():
        return hf, path.read_bytes()
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise BackendError(f"{source} has no fast tokenizer (tokenizer.json)")
    return hf, str(backend.to_str()).encode()


def _load_model(
    source: Path | str,
    precision: str,
    device: str,
    *,
    target: bool = True,
    activations: str = "two",
    scale_cols: int = 0,
) -> PreTrainedModel:
    """`source` loaded and prepared for `precision`. `target`: int8 as a target's, whose
    distribution is the text's: int8 weights quantised here from float ones are smoothed first
    (with block scales of `scale_cols` columns, if given), and every layer's rows are quantised as
    `activations` says (`prepare_model`'s: "two" parts, or "outliers"). A drafter's are none of
    these: it only proposes, in one part, and smoothing cost its 4-bit weights accepted drafts
    (`EmbeddedModel.smoothed`)."""
    rows = activations if target else "one"
    cols = scale_cols if target else 0
    hf_logging.disable_progress_bar()  # the CLI shows its own progress
    if precision == "int8" and isinstance(source, Path) and gguf_int8.has_int8(source):
        model = gguf_int8.load(source)  # converted straight from GGUF: no float32 weights anywhere
        model = prepare_model(
            model,
            precision,
            device,
            int8_cache=source / gguf_int8.INT8_FILE,
            activations=rows,
            scale_cols=cols,
        )
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load a model from {source}: {exc}") from exc
        cache = _int8_cache(source, target, cols) if precision == "int8" else None
        calibration = None
        if target and precision == "int8" and (cache is None or not int8_store.is_packed(cache)):
            calibration = calibration_ids(_load_tokenizer(source)[0])  # quantised now: smoothed first
        model = prepare_model(
            model,
            precision,
            device,
            int8_cache=cache,
            calibration=calibration,
            activations=rows,
            scale_cols=cols,
        )
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Give the heap that loading freed back to the OS (glibc keeps it otherwise).

    Converting to int8 and fusing projections free the file's tensors and the unfused layers,
    but glibc's allocator keeps those pages: the loaded embedded pair stayed gigabytes larger
    than `malloc_trim` leaves it (docs/benchmarks-history.md, "Verify rows on AMX").
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _int8_cache(source: Path | str, smooth: bool, scale_cols: int = 0) -> Path | None:
    """Where a local model's int8 weights are kept: named by its path, its weight files' stamps,
    its smoothing and its scale blocks."""
    path = Path(source)
    if not path.is_dir():
        return None  # a hub id: nothing stable to key the cache by
    stamp = hashlib.sha256(str(path.resolve()).encode())
    stamp.update((SMOOTHING if smooth else "none").encode())  # smoothed another way: another cache
    if scale_cols:
        stamp.update(f"scale-cols:{scale_cols}".encode())  # ... or with other scales
    stamp.update(int8_store.FORMAT.encode())  # ... and packed another way
    for weights in sorted(path.glob("*.safetensors")):
        stat = weights.stat()
        stamp.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return models_dir() / "int8" / f"{stamp.hexdigest()[:32]}.safetensors"


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    configured = getattr(generation, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


@dataclass
class ModelPair:
    """A target, an optional drafter, and their shared tokenizer.

    Attributes:
        tokenizer_json: the tokenizer.json bytes; keys must be bound to their SHA-256.
    """

    target: HFModel
    drafter: HFModel | None
    chat: PreTrainedTokenizerBase
    tokenizer_json: bytes

    def __post_init__(self) -> None:
        self.prompts = PromptEncoder(self.tokenizer_json, self.chat)

    def use_threads(self, plan: ThreadPlan) -> None:
        """Make `plan` the process's (`apply_threads`) and the models' (their forwards' GEMM threads)."""
        apply_threads(plan)
        for model in (self.target, self.drafter):
            if model is not None:
                model.plan = dataclasses.replace(model.plan, gemm_threads=plan.gemm_threads)

    @property
    def tokenizer_sha256(self) -> str:
        """SHA-256 of tokenizer.json: what a key's spec records."""
        return hashlib.sha256(self.tokenizer_json).hexdigest()

    def encode_prompt(self, prompt: str, *, chat: bool = True, system: str | None = None) -> list[int]:
        """Prompt token IDs: through the chat template (default) or raw."""
        if not prompt.strip():
            raise InputError("the prompt is empty")
        if chat:
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": prompt})
            return self.encode_messages(messages)
        return self.prompts.encode_raw(prompt)

    def encode_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token IDs of a conversation (`{"role", "content"}` dicts) through the chat template,
        ending with the assistant's turn to speak; control tokens only where the template puts
        them (`PromptEncoder.encode_messages`)."""
        return self.prompts.encode_messages(messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated tokens (special tokens dropped)."""
        return str(self.prompts.tokenizer.decode(list(token_ids), skip_special_tokens=True))


def load_pair(
    target: str = "embedded",
    drafter: str | None = "embedded",
    *,
    device: str = "cpu",
    precision: str = "auto",
    threads: int | None = None,
    progress: Progress | None = None,
) -> ModelPair:
    """Load the target (and drafter) for generation.

    Args:
        target: "embedded", a local model directory, or an HF model ID in the local cache.
        drafter: the same, or None when the method needs no drafter.
        device: "cpu" or "cuda".
        precision: one of `PRECISIONS`; "auto" is `cpu_precision()` on CPU, bf16 on CUDA; "int8-fast" loads
            the target's int8 weights with a scale per `SCALE_COLS` input columns and runs its
            rows as "outliers" (`RowInt8Linear.activations`); the drafter is int8's.
        threads: CPU threads for torch and the int8 GEMM; None: `$WMARK_THREADS`, else planned
            from the cores free right now (`wmark.generator.cpu.threads.plan_threads`).
        progress: called with a short description of each loading stage.

    Raises:
        BackendError: a model cannot be loaded, or the drafter's tokenizer differs from the target's.
    """
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendError("--device cuda but no CUDA device is available")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be cpu or cuda, got {device!r}")
    if precision == "auto":
        precision = cpu_precision() if device == "cpu" else "bf16"
    target_rows, target_cols = "two", 0
    if precision == "int8-fast":
        if device != "cpu":
            raise BackendError(f"precision int8-fast is CPU-only; use bf16, fp16 or fp32 on {device}")
        precision, target_rows, target_cols = "int8", "outliers", SCALE_COLS  # a cache of its own
    say = progress or (lambda _msg: None)
    try:
        plan = plan_threads(threads)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    apply_threads(plan)
    busy = plan.gemm_threads != plan.torch_threads
    say(
        f"computing with {plan.torch_threads} CPU threads"
        + (f" ({plan.gemm_threads} for the int8 GEMM: a core is busy)" if busy else "")
    )
    say(f"preparing target {target}")
    target_src = resolve_source(target, "target", precision, scale_cols=target_cols)
    chat, tokenizer_json = _load_tokenizer(target_src)
    say("loading target weights")
    target_model = _load_model(target_src, precision, device, activations=target_rows, scale_cols=target_cols)
    draft_model = None
    if drafter is not None:
        say(f"preparing drafter {drafter}")
        draft_src = resolve_source(drafter, "drafter", precision)
        if not _same_vocabulary(tokenizer_json, draft_src):
            raise BackendError(
                f"the drafter {drafter} does not share the target's tokenizer "
                "(speculative decoding needs one vocabulary)"
            )
        say("loading drafter weights")
        draft_model = _load_model(draft_src, precision, device, target=False)
        if draft_model.config.vocab_size > target_model.config.vocab_size:
            raise BackendError("the drafter's vocabulary is larger than the target's")
    eos, threads = _eos_ids(target_model, chat), plan.gemm_threads
    sha = hashlib.sha256(tokenizer_json).hexdigest()
    static = static_plan(device)

    def wrap(model: PreTrainedModel, name: str) -> HFModel:
        return HFModel(model, eos, name=name, tokenizer_sha256=sha, gemm_threads=threads, static=static)

    return ModelPair(
        target=wrap(target_model, str(target)),
        drafter=wrap(draft_model, str(drafter)) if draft_model is not None else None,
        chat=chat,
        tokenizer_json=tokenizer_json,
    )


def static_plan(device: str) -> StaticPlan | None:
    """The cache a loaded model's sessions run on: on CUDA the static cache with its forwards
    replayed as CUDA graphs (`wmark.generator.models.static_forward`), unless
    `$WMARK_CUDA_GRAPHS` is 0; on the CPU (and with graphs off) each session's own slab."""
    if device != "cuda" or os.environ.get("WMARK_CUDA_GRAPHS", "1").strip() == "0":
        return None
    return StaticPlan(graphs=True)


def _same_vocabulary(tokenizer_json: bytes, source: Path | str) -> bool:
    """Whether the model at `source` has the vocabulary of `tokenizer_json`. The same file is
    the common case (the embedded pair) and needs no parsing: two tokenizers of 151k tokens take
    seconds to build (BENCHMARKS.md, "Kernels")."""
    path = Path(source) / "tokenizer.json"
    other = path.read_bytes() if path.is_file() else _load_tokenizer(source)[1]
    return other == tokenizer_json or _vocab(tokenizer_json) == _vocab(other)


def _vocab(tokenizer_json: bytes) -> dict[str, int]:
    return dict(Tokenizer.from_str(tokenizer_json.decode("utf-8")).get_vocab(with_added_tokens=True))
