"""The paraphrase attack: the evaluation's target model rewrites a text in its own words.

The attacker has the model but not the key, so the paraphrase is sampled plainly: the run's
temperature, top-k and top-p, no watermark, one target forward per token. The prompt asks
"Rewrite this text in your own words:" followed by the text, as a system + user conversation
through the chat template in a chat run (joined as plain text in a --raw run), exactly as the
run's own prompts are encoded. Sampling draws from the attack's seeded generator
(`wmark.eval.attacks.attack_rng`), so the same text, row and attack seed give the same paraphrase.

How far the paraphrase moved is its ROUGE-L to the original (`wmark.eval.metrics.rouge_l`: the
LCS F-measure over the target's token IDs, EOS left out), reported with every paraphrase row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from wmark.eval.metrics import rouge_l
from wmark.eval.prompts import SYSTEM_PROMPT, Prompt
from wmark.generator.backend import LanguageModel
from wmark.generator.logits import LogitsConfig, supports

__all__ = [
    "PARAPHRASE_INSTRUCTION",
    "Paraphrase",
    "Paraphraser",
    "paraphrase_budget",
    "paraphrase_prompt",
    "sample_plain",
]

PARAPHRASE_INSTRUCTION = "Rewrite this text in your own words:\n\n"


def paraphrase_prompt(text: str) -> Prompt:
    """The conversation that asks the model for a paraphrase of `text`."""
    return Prompt("paraphrase", messages=(("system", SYSTEM_PROMPT), ("user", PARAPHRASE_INSTRUCTION + text)))


def paraphrase_budget(source_tokens: int) -> int:
    """Token budget of a paraphrase of a `source_tokens`-token text.

    A rewording may run longer than its source and a chat model often opens with a line of its
    own ("Here is the text in my own words:"), so the budget is 1.25x the source plus 16 tokens;
    a paraphrase cut by it is still detected whole.
    """
    return source_tokens + source_tokens // 4 + 16


def sample_plain(
    target: LanguageModel,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    logits: LogitsConfig,
    rng: np.random.Generator,
) -> list[int]:
    """Unwatermarked autoregressive sampling: inverse-CDF draws from `rng` on the processed
    distribution, until an EOS (kept) or `max_new_tokens` tokens."""
    session = target.session(prompt_ids)
    out: list[int] = []
    with torch.inference_mode():
        while len(out) < max_new_tokens:
            root, _ = session.extend([], [])
            dist = supports(root[None], logits)[0]
            cdf = np.cumsum(dist.probs)
            index = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
            token = int(dist.ids[index])
            out.append(token)
            if token in target.eos_token_ids:
                break
            session.accept([], [token])
    return out


@dataclass(frozen=True)
class Paraphrase:
    """A paraphrase and how close it stayed to its source.

    Attributes:
        text: the paraphrase (special tokens dropped).
        token_ids: its token IDs, EOS included when the model stopped.
        rouge_l: ROUGE-L F-measure against the source, over token IDs.
    """

    text: str
    token_ids: tuple[int, ...]
    rouge_l: float


class Paraphraser:
    """Paraphrases texts with the target model (the attacker's side: no key).

    Args:
        target: the model.
        encode: a `Prompt`'s token IDs, the run's own encoding (chat template or raw).
        decode: token IDs -> text.
        logits: the run's sampling settings.
    """

    def __init__(
        self,
        target: LanguageModel,
        *,
        encode: Callable[[Prompt], list[int]],
        decode: Callable[[Sequence[int]], str],
        logits: LogitsConfig,
    ) -> None:
        self._target = target
        self._encode = encode
        self._decode = decode
        self._logits = logits

    def __call__(self, source_ids: Sequence[int], rng: np.random.Generator) -> Paraphrase:
        """A paraphrase of the text with token IDs `source_ids` (EOS ignored)."""
        eos = self._target.eos_token_ids
        source = [t for t in source_ids if t not in eos]
        prompt_ids = self._encode(paraphrase_prompt(self._decode(source)))
        ids = sample_plain(
            self._target,
            prompt_ids,
            max_new_tokens=paraphrase_budget(len(source)),
            logits=self._logits,
            rng=rng,
        )
        words = [t for t in ids if t not in eos]
        return Paraphrase(self._decode(ids), tuple(ids), rouge_l(words, source))
