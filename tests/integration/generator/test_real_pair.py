"""The embedded pair for real (slow: minutes on a CPU; `make test-slow`).

mpfr (B=4, L=4, 128 tokens) on three explanation prompts is detected by `wmark detect` with
p < 0.01 each; pfr-nowm on the same prompts is not; and with the batch-invariant int8 kernels
mpfr emits exactly basic-uwm's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.generator.engine import SamplerConfig, generate

pytestmark = [pytest.mark.slow, pytest.mark.models]
runner = CliRunner()
PROMPTS = [
    "Explain like I'm five: why is the sky blue?",
    "Explain like I'm five: how do airplanes stay up in the air?",
    "Explain like I'm five: why do we have to sleep?",
]


@pytest.fixture(scope="module")
def pair():
    from wmark.generator.models.loading import load_pair

    return load_pair("embedded", "embedded", precision="int8")


def _key() -> str:
    result = runner.invoke(app, ["keys", "create", "real", "--tokenizer", "embedded"])
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def _material(key_id: str):
    from wmark.keys import KeyRegistry, RegistryConfig

    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        return registry.material(key_id, for_generation=True)


def test_mpfr_text_is_detected_and_pfr_nowm_is_not(pair, tmp_path: Path):
    key = _material(_key())
    for i, prompt in enumerate(PROMPTS):
        ids = pair.encode_prompt(prompt)
        for method, drafts in (("mpfr", 4), ("pfr-nowm", 1)):
            config = SamplerConfig(method=method, drafts=drafts, lookahead=4, max_new_tokens=128)
            out = generate(
                pair.target, ids, config=config, key=key, drafter=pair.drafter, seed=i, decode=pair.decode
            )
            path = tmp_path / f"{method}-{i}.txt"
            path.write_text(out.text)
            detection = json.loads(runner.invoke(app, ["detect", str(path), "--json"]).stdout)
            print(method, i, len(out.token_ids), out.aatps, detection["p_value"], detection["n_scored"])
            if method == "mpfr":
                assert detection["verdict"] == "watermarked" and detection["p_value"] < 0.01
            else:
                assert detection["p_value"] >= 0.01


def test_mpfr_emits_basic_uwm_tokens_on_the_real_pair(pair):
    key = _material(_key())
    ids = pair.encode_prompt(PROMPTS[0])
    reference = generate(
        pair.target, ids, config=SamplerConfig(method="basic-uwm", max_new_tokens=48), key=key, seed=9
    )
    for drafts in (1, 4):
        config = SamplerConfig(method="mpfr", drafts=drafts, lookahead=4, max_new_tokens=48)
        out = generate(pair.target, ids, config=config, key=key, drafter=pair.drafter, seed=9)
        assert out.token_ids == reference.token_ids
        assert out.target_forwards == len(out.blocks) < len(reference.blocks)
