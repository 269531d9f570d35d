"""The paraphrase attack: the evaluation's target model rewrites a text in its own words.

The attacker has the model but not the key, so the paraphrase is sampled plainly: the run's
temperature, top-k and top-p, no watermark, one target forward per token. The prompt asks
"Rewrite this text in your own words:" followed by the text, as a system + user conversation
through the chat template in a chat run (joined as plain text in a --raw run), exactly as the
run's own prompts are encoded. Sampling draws from the attack's seeded generator
(`wmark.eval.attacks.attack_rng`), so the same text, row and attack seed give the same paraphrase.

How far the paraphrase moved is its ROUGE-L to the original (`wmark.eval.metrics.rouge_l`: the
LCS F-measure over the target's token IDs, EOS left out), reported with every paraphrase row.

Each paraphrase costs a generation, so `ParaphraseCache` keeps them in the output folder
(paraphrases.jsonl), keyed by everything that decides one: the source tokens, the generator's
state, the model and the sampling settings. A rerun reuses them and loads no model when every
paraphrase it needs is there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from wmark.eval.metrics import rouge_l
from wmark.eval.prompts import SYSTEM_PROMPT, Prompt
from wmark.generator.backend import LanguageModel
from wmark.generator.logits import LogitsConfig, supports

__all__ = [
    "PARAPHRASE_INSTRUCTION",
    "Paraphrase",
    "ParaphraseCache",
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


class ParaphraseCache:
    """Paraphrases kept in a JSONL file, made by `make` (built on first need) when missing.

    Args:
        path: the file (created on the first paraphrase made).
        context: what else decides a paraphrase (model, chat template, sampling settings,
            instruction), as a string; entries made under another context are not reused.
        make: returns the paraphrasing function; called once, at the first cache miss (it
            loads the model).
    """

    def __init__(
        self,
        path: Path,
        context: str,
        make: Callable[[], Callable[[Sequence[int], np.random.Generator], Paraphrase]],
    ) -> None:
        self._path = path
        self._context = context
        self._make = make
        self._paraphrase: Callable[[Sequence[int], np.random.Generator], Paraphrase] | None = None
        self._done: dict[str, Paraphrase] = {}
        text = path.read_text("utf-8") if path.exists() else ""
        self._torn = bool(text) and not text.endswith("\n")  # the next entry starts a line of its own
        if text:
            for line in text.splitlines():
                try:
                    entry = json.loads(line)
                    made = Paraphrase(entry["text"], tuple(entry["token_ids"]), float(entry["rouge_l"]))
                except (ValueError, KeyError, TypeError):  # a line torn by a crash: made again
                    continue
                self._done[str(entry["key"])] = made

    def __call__(self, source_ids: Sequence[int], rng: np.random.Generator) -> Paraphrase:
        """The paraphrase of `source_ids` drawn with `rng`: from the file, or made and appended."""
        state = json.dumps([self._context, [int(t) for t in source_ids], rng.bit_generator.state])
        key = hashlib.sha256(state.encode()).hexdigest()
        if key not in self._done:
            if self._paraphrase is None:
                self._paraphrase = self._make()
            made = self._paraphrase(source_ids, rng)
            with self._path.open("a", encoding="utf-8") as f:
                lead, self._torn = "\n" if self._torn else "", False
                f.write(lead + json.dumps({"key": key, **asdict(made)}, ensure_ascii=False) + "\n")
            self._done[key] = made
        return self._done[key]
