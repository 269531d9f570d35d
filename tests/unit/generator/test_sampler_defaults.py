"""One default sampler everywhere: the library's `SamplerConfig()` drafts as `wmark generate` does.

Before 2026-12-07 the library kept the paper's fixed lookahead (L = 4, every level drafted) while
the CLI and the service used the tuned one, so a Python caller got the slower decoder (0.95x
`basic-uwm` on summaries on a 2-core Zen 4, against the CLI's 1.65x; BENCHMARKS.md).
"""

from __future__ import annotations

import inspect

import pytest

from wmark.cli.generate import generate_cmd
from wmark.errors import InputError
from wmark.generator.engine import SamplerConfig


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
