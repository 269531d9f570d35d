"""The vLLM plugin's settings and request rule: the key from the server, opt-outs by allow-list."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from wmark.integrations.vllm_settings import PluginSettings, watermarked

TOKEN = "batch-eval-team-7f3a"
SETTINGS = PluginSettings.from_env(
    {
        "WMARK_VLLM_KEY_ID": "wk_abc",
        "WMARK_VLLM_UNWATERMARKED": f" {hashlib.sha256(TOKEN.encode()).hexdigest()} ,",
    }
)


def _params(**overrides):
    base = {
        "temperature": 0.8, "watermarking": False, "extra_args": None, "repetition_penalty": 1.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0,
    }  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def test_settings_come_from_the_environment_and_need_a_key():
    assert (SETTINGS.key_id, SETTINGS.diversity_bits) == ("wk_abc", 16.0)
    with pytest.raises(ValueError, match="WMARK_VLLM_KEY_ID"):
        PluginSettings.from_env({})
    with pytest.raises(ValueError, match="DIVERSITY"):
        PluginSettings.from_env({"WMARK_VLLM_KEY_ID": "wk_abc", "WMARK_VLLM_DIVERSITY_BITS": "-1"})


def test_ordinary_requests_are_watermarked():
    """vLLM sets `watermarking` False on every request when its native watermark is off: ignored."""
    assert watermarked(_params(), SETTINGS)
    assert watermarked(_params(extra_args={"wmark_token": TOKEN}), SETTINGS)  # a token alone opts nothing out


@pytest.mark.parametrize(
    "overrides",
    [{"extra_args": {"wmark_watermark": False}}, {"temperature": 0.0}],
    ids=["extra-args", "greedy"],
)
def test_opt_outs_need_an_allowed_token(overrides):
    with pytest.raises(ValueError, match="wmark_token"):
        watermarked(_params(**overrides), SETTINGS)
    extra = {**(overrides.get("extra_args") or {}), "wmark_token": "guess"}
    with pytest.raises(ValueError, match="wmark_token"):
        watermarked(_params(**{**overrides, "extra_args": extra}), SETTINGS)
    extra["wmark_token"] = TOKEN
    assert not watermarked(_params(**{**overrides, "extra_args": extra}), SETTINGS)


@pytest.mark.parametrize(
    "field,value",
    [("repetition_penalty", 1.1), ("frequency_penalty", 0.5), ("presence_penalty", 0.2), ("min_p", 0.05)],
)
def test_sampling_the_race_cannot_see_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        watermarked(_params(**{field: value}), SETTINGS)
