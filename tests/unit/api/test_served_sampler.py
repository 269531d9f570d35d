"""The server's sampler drafts as `wmark generate` does (its tuned CPU defaults, not the paper's)."""

from __future__ import annotations

from wmark.api.generate_settings import GenerationSettings
from wmark.api.generation_job import served_sampler
from wmark.generator.names import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_LOOKAHEAD


def test_the_server_drafts_with_the_cli_defaults_and_the_request_settings():
    settings = GenerationSettings(target="embedded", drafter="auto", top_k=40)
    config = served_sampler(settings, max_tokens=64, temperature=0.7, top_p=0.9)
    assert (config.method, config.drafts) == ("mpfr", 3)
    assert config.lookahead == DEFAULT_LOOKAHEAD == 6
    assert config.draft_confidence == DEFAULT_DRAFT_CONFIDENCE == 0.8
    assert config.max_new_tokens == 64
    for logits in (config.target_logits, config.draft_logits):
        assert (logits.temperature, logits.top_k, logits.top_p) == (0.7, 40, 0.9)


def test_a_server_without_a_drafter_samples_one_token_a_forward():
    config = served_sampler(GenerationSettings(target="embedded"), max_tokens=8, temperature=1.0, top_p=1.0)
    assert config.method == "basic-uwm"
