"""Which forward a model's sessions run, decided once, in one object (`ForwardPlan`).

A session's forward has three choices to make, and each changes either the bits or the speed:

- **attention** for a session's rows: `rows_exact` sends every row through wmark's tree kernel,
  so a row's numbers depend on that row alone (a target: the text cannot depend on the drafter);
  otherwise stock SDPA, whose rounding depends on the block's shape (a drafter: it only proposes).
  A prompt's prefill always runs SDPA: it is a function of the prompt alone, the same for every
  session of that prompt.
- **decoder**: wmark's own layer loop (`LeanDecoder`) where the architecture is one it runs, else
  transformers' forward (any other causal LM).
- **threads** of the int8 GEMM and the tree kernel for this model's forwards (the CPU thread plan
  made at load; a drafter may tune them per row count).

`docs/architecture.md` ("Which forward runs") tables the result per precision, device and rows.
On CUDA a plan also restricts SDPA to its memory-efficient kernel (and the math fallback): with
a float mask SDPA otherwise picks cuDNN's, which builds an execution plan on every call (1.7 ms
of a decode step's 24-77 ms measured on an H200) and which a CUDA graph should not record.
The plan also names the keyword under which the installed transformers takes the KV cache:
`cache` from 5.25, `past_key_values` before (an older version puts an unknown keyword into
`**kwargs` and runs with no cache at all, so guessing wrong is silent).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.nn.attention import SDPBackend, sdpa_kernel

from wmark.errors import BackendError
from wmark.generator.cpu.attention import ATTENTION_NAME, stock_attention
from wmark.generator.cpu.rowwise import gemm_threads_for
from wmark.generator.models.lean_decoder import LeanDecoder, lean_decoder

__all__ = ["ForwardPlan", "cache_keyword"]


def cache_keyword(model: Any) -> str:
    """The keyword of `model`'s forward that takes the KV cache: "cache" (transformers >= 5.25)
    or "past_key_values" (older versions).

    Raises:
        BackendError: the forward takes neither (not a transformers causal LM).
    """
    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    raise BackendError(
        f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values`: "
        "not a causal LM of a transformers version wmark supports"
    )


@dataclass(frozen=True)
class ForwardPlan:
    """How one model's session forwards run (see the module docstring).

    Attributes:
        rows_exact: every row of a session forward attends through the tree kernel (batch
            invariant); False: SDPA. Only a model prepared for the int8 or exact-fp32 precision
            has the kernel to run (`wmark.generator.models.prepare`).
        decoder: wmark's layer loop, or None for transformers' forward.
        gemm_threads: threads of the int8 GEMM and tree kernel per call; None: torch's count.
        cache_keyword: the forward's KV-cache keyword (`cache_keyword`).
        cuda: the model is on a CUDA device (SDPA's backends restricted, see the module).
    """

    rows_exact: bool
    decoder: LeanDecoder | None
    gemm_threads: int | None
    cache_keyword: str
    cuda: bool = False

    @classmethod
    def target(cls, model: Any, gemm_threads: int | None = None) -> ForwardPlan:
        """The plan of a model whose sampled tokens are the text: batch invariant wherever the
        model was prepared for it, on wmark's decoder where that decoder runs int8 layers
        (an exact-fp32 model keeps transformers' forward, with the row kernel as its attention)."""
        rowwise = model.config._attn_implementation == ATTENTION_NAME  # prepared so on the CPU only
        decoder = None
        if rowwise:
            lean = lean_decoder(model, exact=True)
            decoder = lean if lean is not None and lean.int8 is not None else None
        return cls(rowwise, decoder, gemm_threads, cache_keyword(model), _on_cuda(model))

    @classmethod
    def drafter(cls, model: Any, gemm_threads: int | None = None) -> ForwardPlan:
        """The plan of a draft model: SDPA attention and wmark's decoder wherever it runs, its
        threads tuned per row count (`wmark.generator.cpu.thread_tuner`)."""
        return cls(
            False, lean_decoder(model, tune_threads=True), gemm_threads, cache_keyword(model), _on_cuda(model)
        )

    @contextlib.contextmanager
    def running(self, prefill: bool = False) -> Iterator[None]:
        """The context a forward of this plan runs in: its threads, and SDPA in place of the row
        kernel where the plan (or a prefill) asks for it."""
        stock = prefill or not self.rows_exact
        with contextlib.ExitStack() as stack:
            stack.enter_context(gemm_threads_for(self.gemm_threads))
            if stock:
                stack.enter_context(stock_attention())
            if self.cuda:
                stack.enter_context(sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]))
            yield


def _on_cuda(model: Any) -> bool:
    """Whether `model`'s weights are on a CUDA device (a model with no parameters: no)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first is not None and first.device.type == "cuda"
