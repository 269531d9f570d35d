"""The paraphrase attack on a tiny random model: plain sampling draws from the processed
distribution and is reproducible per seed; the paraphraser asks for the rewrite with the text in
the prompt, stays within its budget and reports ROUGE-L against the source."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from wmark.eval.metrics import rouge_l
from wmark.eval.paraphrase import (
    PARAPHRASE_INSTRUCTION,
    Paraphraser,
    paraphrase_budget,
    paraphrase_prompt,
    sample_plain,
)
from wmark.eval.prompts import Prompt
from wmark.generator.logits import LogitsConfig, supports

LOGITS = LogitsConfig(temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def target(tiny_trio):
    return tiny_trio()["target"]


def test_same_seed_same_paraphrase_and_other_seeds_differ(target):
    prompt = [5, 17, 42, 99]

    def draw(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return sample_plain(target, prompt, max_new_tokens=24, logits=LOGITS, rng=rng)

    first = draw(0)
    assert first == draw(0)
    assert len(first) == 24 or first[-1] in target.eos_token_ids  # the budget or an EOS ends it
    assert all(t not in target.eos_token_ids for t in first[:-1])
    assert len({tuple(draw(s)) for s in range(1, 6)} | {tuple(first)}) > 1


def test_first_token_frequencies_match_the_processed_distribution(target):
    prompt = [3, 1, 4, 1, 5]
    dist = supports(target.session(prompt).extend([], [])[0][None], LOGITS)[0]
    rng = np.random.default_rng(11)
    draws = [sample_plain(target, prompt, max_new_tokens=1, logits=LOGITS, rng=rng)[0] for _ in range(3000)]
    observed = np.array([draws.count(int(t)) for t in dist.ids])
    assert observed.sum() == len(draws)  # nothing outside the top-k support
    # Chi-square goodness of fit, 7 degrees of freedom; seeded, so the outcome is fixed. A sampler
    # off by a shifted CDF index moves every cell by a whole probability and fails at 1e-4.
    _, p_value = stats.chisquare(observed, dist.probs * len(draws))
    assert p_value > 1e-4, (observed, dist.probs)


def test_paraphraser_prompts_with_the_text_and_reports_rouge(target):
    seen: list[Prompt] = []

    def encode(prompt: Prompt) -> list[int]:
        seen.append(prompt)
        return [int(w) % 256 for w in prompt.chat_messages()[-1]["content"].split() if w.isdigit()][-32:]

    def decode(ids) -> str:
        return " ".join(str(i) for i in ids)

    paraphraser = Paraphraser(target, encode=encode, decode=decode, logits=LOGITS)
    source = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0]  # an answer ending in EOS (id 0)
    made = paraphraser(source, np.random.default_rng(3))
    assert seen[0] == paraphrase_prompt("7 8 9 10 11 12 13 14 15 16")  # EOS is not part of the text
    assert seen[0].chat_messages()[-1]["content"].startswith(PARAPHRASE_INSTRUCTION)
    assert 1 <= len(made.token_ids) <= paraphrase_budget(10)
    words = [t for t in made.token_ids if t not in target.eos_token_ids]
    assert made.text == decode(made.token_ids)
    assert made.rouge_l == rouge_l(words, source[:-1]) and 0.0 <= made.rouge_l <= 1.0
    assert paraphraser(source, np.random.default_rng(3)) == made
