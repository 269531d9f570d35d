"""The calibrations kept with each key: stored, audited, newest first, stale when the spec changes."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from wmark.errors import KeyNotFoundError
from wmark.keys.calibrations import spec_digest
from wmark.keys.models import Key
from wmark.spec import WatermarkSpec


def _add(registry, key_id: str, corpus: str = "a" * 64, flagged: int = 3):
    return registry.calibrations.add(
        key_id,
        corpus_sha256=corpus,
        alpha=0.01,
        n_scored=400,
        n_flagged=flagged,
        report={"fpr": {"rate": flagged / 400}},
        actor="test",
    )


def test_a_calibration_is_stored_audited_and_the_newest_is_the_keys(registry, word_tokenizer_json):
    ref = registry.add_tokenizer(word_tokenizer_json, "words")
    key, other = registry.create_key("a", ref), registry.create_key("b", ref)
    assert registry.calibrations.latest(key.key_id) is None
    first = _add(registry, key.key_id, "1" * 64, flagged=3)
    second = _add(registry, key.key_id, "2" * 64, flagged=5)
    latest = registry.calibrations.latest(key.key_id)
    assert latest is not None and latest.calibration_id == second.calibration_id != first.calibration_id
    assert latest.corpus_sha256 == "2" * 64 and latest.report == {"fpr": {"rate": 5 / 400}}
    assert latest.spec_sha256 == spec_digest(key.spec.to_json()) and not latest.stale
    audit = registry.audit.page(limit=1, action="key_calibrate")[0]
    assert audit.key_ids == (key.key_id,) and audit.actor == "test"
    assert audit.result["calibration_id"] == second.calibration_id and audit.result["n_flagged"] == 5
    states = registry.calibrations.states([key.key_id, other.key_id, "wk_unknown"])
    assert states == {key.key_id: "calibrated", other.key_id: "uncalibrated"}
    with pytest.raises(KeyNotFoundError):
        _add(registry, "wk_unknown")
    with pytest.raises(KeyNotFoundError):
        registry.calibrations.latest("wk_unknown")


def test_a_calibration_made_under_another_spec_is_stale(registry, word_tokenizer_json):
    ref = registry.add_tokenizer(word_tokenizer_json, "words")
    key = registry.create_key("a", ref)
    _add(registry, key.key_id)
    changed = WatermarkSpec.from_dict({**key.spec.to_dict(), "min_scored_tokens": 32}).to_json()
    with registry.sessions.begin() as session:
        session.execute(update(Key).where(Key.id == key.key_id).values(spec=changed))
    assert registry.calibrations.states([key.key_id]) == {key.key_id: "stale"}
    latest = registry.calibrations.latest(key.key_id)
    assert latest is not None and latest.stale
    _add(registry, key.key_id)  # calibrated again, under the spec it has now
    assert registry.calibrations.states([key.key_id]) == {key.key_id: "calibrated"}
