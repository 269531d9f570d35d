"""vLLM 0.32 (CPU) serving a tiny random Qwen2 model with wmark's logits processor, for real.

Run by `make test-vllm` in vLLM's own venv. The processor records the logits rows it was given;
wmark's `basic-uwm` replayed on exactly those logits must emit the same tokens, and the output
must be detected with the key. Requests vLLM must refuse (greedy without an allowed opt-out
token, penalties) are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: logits recorded
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

with warnings.catch_warnings():  # vLLM's imports warn about torch APIs it still uses
    warnings.simplefilter("ignore")
    from vllm import LLM, SamplingParams
    from vllm.exceptions import VLLMValidationError

from wmark.detector import Detector  # noqa: E402
from wmark.generator.engine import SamplerConfig, generate  # noqa: E402
from wmark.generator.fakes import FakeLM  # noqa: E402
from wmark.generator.logits import LogitsConfig  # noqa: E402
from wmark.integrations.vllm import WmarkLogitsProcessor  # noqa: E402
from wmark.keys import KeyRegistry, RegistryConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)
N_TOKENS = 96
OPT_OUT = "eval-team-token"


class RecordingProcessor(WmarkLogitsProcessor):
    """The plugin, recording (context -> logits row) for every watermarked row it forces."""

    seen: ClassVar[dict[tuple[int, ...], torch.Tensor]] = {}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, race in self.batch.rows.items():
            self.seen[tuple(race.prompt + race.outputs)] = logits[index].clone()
        return super().apply(logits)


def _tiny_qwen2(path: Path, tokenizer_json: bytes, vocab: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=0,
        bos_token_id=0,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # peaked rows: realistic entropy, not a near-uniform 500-way choice
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_bytes(tokenizer_json)
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "eos_token": "[UNK]"})
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, word_tokenizer_json: bytes) -> Any:
    root = tmp_path_factory.mktemp("vllm")
    _tiny_qwen2(root / "model", word_tokenizer_json, vocab=501)
    home = root / "wmark-home"
    mp = pytest.MonkeyPatch()
    mp.setenv("WMARK_HOME", str(home))
    mp.delenv("WMARK_DATABASE_URL", raising=False)
    mp.delenv("WMARK_MASTER_KEY", raising=False)
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        ref = registry.add_tokenizer(word_tokenizer_json, "words")
        key_id = registry.create_key("vllm", ref).key_id
        key = registry.material(key_id)
    mp.setenv("WMARK_VLLM_KEY_ID", key_id)
    mp.setenv("WMARK_VLLM_UNWATERMARKED", hashlib.sha256(OPT_OUT.encode()).hexdigest())
    llm = LLM(
        model=str(root / "model"), logits_processors=[RecordingProcessor], dtype="float32", max_model_len=256,
        enforce_eager=True, seed=0,
    )  # fmt: skip
    yield llm, key
    mp.undo()


def test_served_tokens_equal_basic_uwm_on_the_same_logits_and_are_detected(served):
    llm, key = served
    prompts = [[5, 17, 240, 33], [400, 2, 2, 2, 2, 9], [77]]
    params = [
        SamplingParams(temperature=1.0, top_k=50, seed=11 + i, max_tokens=N_TOKENS, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    detector = Detector([key])
    race = LogitsConfig(temperature=1.0, top_k=50)
    config = SamplerConfig(method="basic-uwm", max_new_tokens=N_TOKENS, target_logits=race, diversity_bits=16)
    for prompt, param, out in zip(prompts, params, outputs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        assert len(tokens) == N_TOKENS
        replay = FakeLM(501, lambda ctx: RecordingProcessor.seen[ctx].numpy().astype("float64"))
        expected = generate(replay, prompt, config=config, key=key, seed=param.seed).token_ids
        assert tokens == list(expected)
        detection = detector.detect(token_ids=tokens)
        assert detection.verdict == "watermarked" and detection.p_value < 1e-6, detection


def test_opt_outs_need_an_allowed_token_and_penalties_are_refused(served):
    llm, _ = served
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    for refused, reason in (
        (SamplingParams(temperature=0.0, max_tokens=4), "wmark_token"),
        (SamplingParams(temperature=1.0, max_tokens=4, extra_args={"wmark_watermark": False}), "wmark_token"),
        (SamplingParams(temperature=1.0, max_tokens=4, repetition_penalty=1.2), "repetition_penalty"),
    ):
        with pytest.raises(VLLMValidationError, match=reason):  # HTTP 400 under `vllm serve`
            llm.generate(prompt, refused)
    allowed = SamplingParams(temperature=0.0, max_tokens=4, extra_args={"wmark_token": OPT_OUT})
    assert len(llm.generate(prompt, allowed)[0].outputs[0].token_ids) == 4
