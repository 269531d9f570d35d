"""Tiny random transformers shared by the generator, baseline and CLI tests (built here, seeded).

Two kinds, each behind a factory fixture:
- `tiny_qwen` / `tiny_trio`: in-memory Qwen2 models over 256 token ids (EOS = 0) with a sharpened
  output layer, so their entropy is like natural language's rather than near-uniform;
- `word_model_dir`: a model saved with a whitespace word-level tokenizer ("w0" ... "w199", EOS
  "[EOS]" = id 1), loadable by `wmark generate` / `wmark eval` as a local model directory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model

TINY_VOCAB = 256
TINY_EOS = 0
N_WORDS = 200


def _tiny_qwen(seed: int, sharpen: float = 6.0) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)  # natural-language-like entropy instead of near-uniform
    return model


def _tiny_trio(sharpen: float = 6.0) -> dict[str, HFModel]:
    base = _tiny_qwen(0, sharpen)
    close = copy.deepcopy(base)
    with torch.no_grad():  # a drafter that mostly agrees with the target
        for p in close.parameters():
            p.add_(0.02 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    eos = frozenset({TINY_EOS})
    return {
        "target": HFModel(prepare_model(base, "exact-fp32", "cpu"), eos),
        "close": HFModel(prepare_model(close, "exact-fp32", "cpu"), eos),
        "unrelated": HFModel(prepare_model(_tiny_qwen(2, sharpen), "exact-fp32", "cpu"), eos),
    }


def _word_model_dir(path: Path, seed: int, prefix: str = "w") -> Path:
    config = Qwen2Config(
        vocab_size=N_WORDS + 2,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
        # EOS (id 1) gets logit 0 while ~half of the 200 words score above 0: it never makes the
        # top 50, so answers run to the token budget and are long enough to detect.
        model.lm_head.weight[1].zero_()
    model.save_pretrained(path)
    vocab = {"[UNK]": 0, "[EOS]": 1, **{f"{prefix}{i}": i + 2 for i in range(N_WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen() -> Callable[..., Qwen2ForCausalLM]:
    """`tiny_qwen(seed, sharpen=6.0)`: a fresh float32 model (callers may quantise it in place)."""
    return _tiny_qwen


@pytest.fixture(scope="session")
def tiny_trio() -> Callable[..., dict[str, HFModel]]:
    """`tiny_trio(sharpen=6.0)`: target, a "close" drafter (target + small noise), an "unrelated" one."""
    return _tiny_trio


@pytest.fixture(scope="session")
def word_model_dir() -> Callable[..., Path]:
    """`word_model_dir(path, seed, prefix="w")`: save a model and its word tokenizer under path."""
    return _word_model_dir
