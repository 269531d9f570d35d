"""One default sampler everywhere: the library's `SamplerConfig()` drafts as `wmark generate` does.

Before 2026-12-07 the library kept the paper's fixed lookahead (L = 4, every level drafted) while
the CLI and the service used the tuned one, so a Python caller got the slower decoder (0.95x
`basic-uwm` on summaries on a 2-core Zen 4, against the CLI's 1.65x; BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import pytest

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.cli.generate import generate_cmd
from wmark.errors import InputError
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM


def _cli_default(name: str) -> object:
    return inspect.signature(generate_cmd).parameters[name].default


def test_the_library_default_is_the_cli_default():
    config = SamplerConfig()
    assert (config.method, config.drafts, config.lookahead, config.draft_confidence) == ("mpfr", 3, 6, 0.8)
    assert config.lookahead == _cli_default("lookahead")
    assert config.draft_confidence == _cli_default("draft_confidence")
    assert config.lookup_lookahead == _cli_default("lookup_lookahead") == 0
    assert _cli_default("method") == config.method


def test_the_papers_fixed_lookahead_is_still_one_setting_away():
    config = SamplerConfig(lookahead=4, draft_confidence=0.0)
    assert (config.lookahead, config.draft_confidence) == (4, 0.0)
    with pytest.raises(InputError, match="draft_confidence"):
        SamplerConfig(draft_confidence=1.0)


# Which samplers the dynamic lookahead reaches (documented on `SamplerConfig.draft_confidence`
# and `wmark generate --help`): the tree samplers stop a branch at an unlikely draft; the chain
# baselines draft L tokens whatever it is, as their papers define them.
P = np.array([0.34, 0.22, 0.16, 0.12, 0.09, 0.05, 0.02])
Q = np.array([0.10, 0.35, 0.05, 0.25, 0.05, 0.05, 0.15])  # no draft token reaches 0.8
KEY = KeyMaterial(
    key_id="k",
    secret=Secret(hashlib.sha256(b"defaults").digest()),
    spec=WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=len(P))),
)


def _drafted(method: str, confidence: float) -> tuple[int, ...]:
    config = SamplerConfig(method=method, max_new_tokens=60, lookahead=4, draft_confidence=confidence)
    result = generate(FakeLM.fixed(P), [1, 2, 3], config=config, key=KEY, drafter=FakeLM.fixed(Q), seed=5)
    return tuple(result.drafted)


@pytest.mark.parametrize("method", ["pfr", "pfr-nowm", "mpfr", "gls"])
def test_the_tree_samplers_end_a_branch_at_an_unlikely_draft(method):
    # Q's largest probability is 0.35 < 0.8: every branch ends after its first draft.
    assert max(_drafted(method, 0.8)) < max(_drafted(method, 0.0))


@pytest.mark.parametrize("method", ["vsps", "mws", "mse", "mse-pseudo"])
def test_the_chain_baselines_draft_l_tokens_whatever_the_confidence(method):
    assert _drafted(method, 0.8) == _drafted(method, 0.0)
