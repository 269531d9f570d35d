"""Loading the models of an evaluation: one target and any number of drafters.

A drafter is one of `--drafter`'s choices (`wmark.generator.drafters.build`: "ngram", "embedded",
"auto", a local model folder or a cached HF model id), or "target": the target itself drafting
(same weights, its own session), the drafter-substitution ablation's largest drafter at no extra
memory. Every drafter must share the target's tokenizer (speculative decoding needs one
vocabulary), as `load_pair` checks for its drafter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenizers import Tokenizer

from wmark.errors import BackendError, InputError
from wmark.eval.prompts import Prompt
from wmark.eval.runner import EvalModels
from wmark.generator.backend import LanguageModel
from wmark.generator.drafters.build import build_drafter, drafter_model_source
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import ModelPair, load_pair

__all__ = ["TARGET_AS_DRAFTER", "load_models", "prompt_encoder"]

TARGET_AS_DRAFTER = "target"


def prompt_encoder(pair: ModelPair, *, chat: bool) -> Callable[[Prompt], list[int]]:
    """Prompt -> token IDs: through the target's chat template, or (raw) its contents joined.

    A prompt marked `raw` (a plain-text template) is never put in the chat template.
    """

    def encode(prompt: Prompt) -> list[int]:
        if prompt.raw:  # a plain-text template: the model reads it exactly as written
            return pair.encode_prompt(prompt.prompt or "", chat=False)
        if not chat:
            text = "\n\n".join(m["content"] for m in prompt.chat_messages())
            return pair.encode_prompt(text, chat=False)
        if not getattr(pair.chat, "chat_template", None):
            raise InputError("the target has no chat template: use --raw")
        rendered = pair.chat.apply_chat_template(
            prompt.chat_messages(), add_generation_prompt=True, tokenize=False
        )
        return pair.encode_prompt(str(rendered), chat=False)

    return encode


def load_models(
    target: str,
    drafters: Sequence[str],
    *,
    device: str,
    precision: str,
    chat: bool,
    progress: Callable[[str], None] | None = None,
) -> tuple[EvalModels, ModelPair]:
    """Load the target and every drafter; returns the models and the target's pair (tokenizer).

    Raises:
        BackendError: a model cannot be loaded or does not share the target's tokenizer.
    """
    sources = {d: drafter_model_source(d, target) for d in drafters if d != TARGET_AS_DRAFTER}
    separate = list(dict.fromkeys(src for src in sources.values() if src is not None))
    pair = load_pair(
        target, separate[0] if separate else None, device=device, precision=precision, progress=progress
    )
    loaded: dict[str, LanguageModel] = {}
    if pair.drafter is not None:
        loaded[separate[0]] = pair.drafter
    vocab = _vocab(pair.tokenizer_json)
    for name in separate[1:]:
        other = load_pair(name, None, device=device, precision=precision, progress=progress)
        if _vocab(other.tokenizer_json) != vocab:
            raise BackendError(f"the drafter {name} does not share the target's tokenizer")
        if other.target.vocab_size > pair.target.vocab_size:
            raise BackendError(f"the drafter {name}'s vocabulary is larger than the target's")
        loaded[name] = HFModel(
            other.target.model, pair.target.eos_token_ids, name=name, tokenizer_sha256=pair.tokenizer_sha256
        )
    models = {d: build_drafter(d, pair.target, loaded.get(src or "")) for d, src in sources.items()}
    if TARGET_AS_DRAFTER in drafters:
        models[TARGET_AS_DRAFTER] = pair.target  # sessions are independent: no second copy of the weights
    evaluation = EvalModels(
        target=pair.target,
        drafters=models,
        encode=prompt_encoder(pair, chat=chat),
        encode_text=lambda text: pair.encode_prompt(text, chat=False),
        decode=pair.decode,
    )
    return evaluation, pair


def _vocab(tokenizer_json: bytes) -> dict[str, int]:
    return dict(Tokenizer.from_str(tokenizer_json.decode("utf-8")).get_vocab(with_added_tokens=True))
