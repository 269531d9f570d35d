"""`--drafter ngram|embedded|auto|PATH`: which drafter proposes, and which model that needs loaded.

- `ngram`: prompt lookup alone (`wmark.generator.drafters.prompt_lookup`): no model, no drafter forward.
- `embedded`: the embedded 0.5B drafter, its output layer cut to the common tokens
  (`wmark.generator.drafters.truncated_head`).
- `auto` (default): prompt lookup where the text repeats, the embedded drafter elsewhere, reading
  the prompt's last `MODEL_CONTEXT` tokens on a CPU and all of it on a GPU
  (`wmark.generator.drafters.hybrid`); with a target other than the embedded one, prompt lookup.
- a model folder or cached HF id: that model as it is.

A draft model runs a drafter's `ForwardPlan` (stock SDPA, threads tuned per row count) unless
it is the target itself: it only proposes, so the batch invariance the target needs buys it
nothing. For the same reason its int8 layers are cut to 4-bit weights where the CPU runs them vectorised
(`wmark.generator.drafters.int4_weights`: half the bytes a memory-bound forward reads). Its forwards also
bypass transformers' generic decoder where the architecture allows
(`wmark.generator.models.lean_decoder`).
Every choice leaves the text unchanged (the target's race winners); it moves speed only.
"""

from __future__ import annotations

from wmark.generator.backend import LanguageModel
from wmark.generator.drafters.hybrid import MODEL_CONTEXT, HybridDrafter
from wmark.generator.drafters.int4_weights import cut_to_int4, int4_pays
from wmark.generator.drafters.prompt_lookup import PromptLookup
from wmark.generator.drafters.truncated_head import TruncatedHead, truncate_head
from wmark.generator.models.forward_plan import ForwardPlan
from wmark.generator.models.hf_session import HFModel
from wmark.generator.names import AUTO, EMBEDDED, NGRAM

__all__ = ["build_drafter", "drafter_model_source"]


def drafter_model_source(drafter: str, target: str) -> str | None:
    """The draft model to load for `drafter` with `target` (None: the drafter needs no model)."""
    if drafter == NGRAM:
        return None
    if drafter == AUTO:
        return EMBEDDED if target == EMBEDDED else None
    return drafter


def build_drafter(
    drafter: str, target: LanguageModel, model: LanguageModel | None, *, int4: bool | None = None
) -> LanguageModel:
    """The drafter named `drafter`, given the target and the model `drafter_model_source` loaded.

    `int4`: cut a draft model's int8 layers to 4-bit weights (None: where `int4_pays()`).
    """
    if model is None:
        if drafter not in (NGRAM, AUTO):
            raise ValueError(f"the drafter {drafter} needs its model loaded")
        return PromptLookup(target.vocab_size, target.eos_token_ids, tokenizer_sha256=target.tokenizer_sha256)
    cut = isinstance(model, HFModel) and isinstance(model.model.get_output_embeddings(), TruncatedHead)
    if drafter in (EMBEDDED, AUTO) and isinstance(model, HFModel) and not cut:
        truncate_head(model)
    if isinstance(model, HFModel) and model is not target:
        if int4_pays() if int4 is None else int4:
            cut_to_int4(model.model)
        model.plan = ForwardPlan.drafter(model.model, model.plan.gemm_threads)
    if drafter != AUTO:
        return model
    # The draft model reads the prompt's tail where it runs on a CPU, whose prefill is
    # compute-bound (~1 ms a token for the 0.5B drafter: `MODEL_CONTEXT`); on a GPU a prompt's
    # prefill costs about one forward, so it reads the whole prompt and keeps the acceptance.
    device = getattr(model, "device", None)
    on_cpu = device is None or device.type == "cpu"
    return HybridDrafter(model, context=MODEL_CONTEXT if on_cpu else None)
