"""A key marks only text of the tokenizer it is bound to: `generate` itself refuses another one."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import TokenizerError
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM

P = np.array([0.5, 0.3, 0.2])
BOUND = "a" * 64


def _key() -> KeyMaterial:
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256=BOUND, vocab_size=len(P)))
    return KeyMaterial(key_id="k", secret=Secret(hashlib.sha256(b"binding").digest()), spec=spec)


def _model(sha: str | None) -> FakeLM:
    model = FakeLM.fixed(P)
    model.tokenizer_sha256 = sha
    return model


@pytest.mark.parametrize("method", ["basic-uwm", "pfr", "mpfr"])
def test_generate_refuses_a_key_bound_to_another_tokenizer(method):
    config = SamplerConfig(method=method, max_new_tokens=4)
    with pytest.raises(TokenizerError, match="bound to tokenizer aaaaaaaaaaaa"):
        generate(_model("b" * 64), [1], config=config, key=_key(), drafter=_model("b" * 64), seed=1)


@pytest.mark.parametrize("sha", [BOUND, None], ids=["same tokenizer", "unknown tokenizer"])
def test_generate_accepts_the_bound_tokenizer_or_raw_ids(sha):
    result = generate(
        _model(sha), [1], config=SamplerConfig(max_new_tokens=4), key=_key(), drafter=_model(sha), seed=1
    )
    assert len(result.token_ids) == 4


def test_unkeyed_methods_need_no_binding():
    config = SamplerConfig(method="pfr-nowm", max_new_tokens=4)
    result = generate(_model("b" * 64), [1], config=config, key=_key(), drafter=_model("b" * 64), seed=1)
    assert len(result.token_ids) == 4
