"""wmark's keyed race inside vLLM: a vLLM v1 logits processor for non-speculative serving.

    WMARK_VLLM_KEY_ID=wk_... vllm serve ./model \\
        --logits-processors wmark.integrations.vllm:WmarkLogitsProcessor
    LLM("./model", logits_processors=[WmarkLogitsProcessor])            # offline, same variables

Every sampled token of a request is the winner of wmark's keyed race (`RaceBatch`), so the text
is detected by `wmark detect` with the key, exactly as text from `wmark generate --method
basic-uwm`. The key and the opt-out allow-list come from the server's environment, never from
the request (`wmark.integrations.vllm_settings`).

vLLM 0.32 refuses custom logits processors under speculative decoding; vLLM's native watermark
(`--watermark-config`, dual_key_gumbel) covers that case, and wmark detects it (`wmark keys
create --scheme vllm-dual-key-gumbel`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from wmark.detector.tokenize import read_tokenizer_source
from wmark.generator.logits import LogitsConfig
from wmark.integrations.race_batch import RaceBatch, RequestRace
from wmark.integrations.vllm_settings import PluginSettings, watermarked
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry, RegistryConfig

__all__ = ["WmarkLogitsProcessor", "load_key"]


def load_key(settings: PluginSettings, tokenizer_source: str) -> KeyMaterial:
    """The key from wmark's registry, checked to be bound to the served tokenizer."""
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(settings.key_id, for_generation=True)
    data, _ = read_tokenizer_source(tokenizer_source)
    if hashlib.sha256(data).hexdigest() != key.spec.tokenizer.sha256:
        raise ValueError(
            f"key {key.key_id} is bound to tokenizer {key.spec.tokenizer.name} "
            f"({key.spec.tokenizer.sha256[:12]}), not the one served from {tokenizer_source}"
        )
    return key


class WmarkLogitsProcessor(LogitsProcessor):  # type: ignore[misc]  # vLLM is untyped here
    """Forces each watermarked request's next token to the winner of wmark's keyed race."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse (400) what the race cannot honour; see the module docstring."""
        watermarked(sampling_params, PluginSettings.from_env())

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        del device, is_pin_memory
        if vllm_config.speculative_config is not None:
            raise ValueError(
                "wmark's logits processor needs non-speculative serving; for speculative decoding use "
                "vLLM's --watermark-config dual_key_gumbel (wmark detects it)"
            )
        self.settings = PluginSettings.from_env()
        self.key = load_key(self.settings, vllm_config.model_config.tokenizer)
        self.batch = RaceBatch()

    def is_argmax_invariant(self) -> bool:
        """False: it picks the token, so vLLM must apply it to greedy rows' batches too."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow vLLM's persistent batch: removed, then added, then moved requests."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.batch.remove(index)
        for index, params, prompt, outputs in batch_update.added:
            race = None
            if watermarked(params, self.settings):
                config = LogitsConfig(
                    temperature=params.temperature, top_k=max(params.top_k, 0), top_p=params.top_p
                )
                race = RequestRace.start(
                    self.key,
                    list(prompt or []),
                    outputs,
                    config,
                    seed=params.seed,
                    diversity_bits=self.settings.diversity_bits,
                )
            self.batch.add(index, race)
        for source, target, direction in batch_update.moved:
            self.batch.move(source, target, swap=direction == MoveDirectionality.SWAP)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force watermarked rows to their race winners (in place)."""
        return self.batch.apply(logits)
