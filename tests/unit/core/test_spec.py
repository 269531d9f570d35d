"""WatermarkSpec: canonical JSON round trip and validation with helpful messages."""

from __future__ import annotations

import dataclasses

import pytest

from wmark import SpecError, TokenizerRef, WatermarkSpec

REF = TokenizerRef(name="t", sha256="a" * 64, vocab_size=1000)


def test_json_round_trip_is_exact_and_canonical():
    spec = WatermarkSpec(tokenizer=REF, context_width=6, min_scored_tokens=32)
    text = spec.to_json()
    assert WatermarkSpec.from_json(text) == spec
    assert WatermarkSpec.from_json(text).to_json() == text
    assert " " not in text and text.index('"context_mode"') < text.index('"tokenizer"')


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        WatermarkSpec(tokenizer=REF).context_width = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"context_width": 0}, "context_width"),
        ({"context_width": 17}, "context_width"),
        ({"context_mode": "ngram"}, "context_mode"),
        ({"dedup": "none"}, "dedup"),
        ({"spec_version": 99}, "upgrade wmark"),
        ({"min_scored_tokens": 0}, "min_scored_tokens"),
    ],
)
def test_invalid_specs_are_refused_with_a_reason(changes, message):
    with pytest.raises(SpecError, match=message):
        WatermarkSpec(tokenizer=REF, **changes)


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"tokenizer": {"name": "t"}}',
        '{"tokenizer": {"name": "t", "sha256": "' + "a" * 64 + '", "vocab_size": 5}, "extra": 1}',
    ],
)
def test_malformed_json_is_a_spec_error(text):
    with pytest.raises(SpecError):
        WatermarkSpec.from_json(text)


def test_prefix_mode_may_skip_dedup():
    spec = WatermarkSpec(tokenizer=REF, context_mode="prefix", dedup="none")
    assert spec.context_mode == "prefix"
