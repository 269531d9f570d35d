"""Calibrations through the service: GET /v1/keys/{id} reports the newest, detection answers name the
keys never calibrated (or under another spec), from a cache that the detection path does not wait on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from wmark.api import Settings, create_app
from wmark.api.calibration_states import CalibrationStates
from wmark.keys.models import Key
from wmark.spec import WatermarkSpec


@pytest.fixture()
def client(registry_config, word_tokenizer_json) -> Iterator[TestClient]:
    settings = Settings(registry=registry_config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    with TestClient(create_app(settings)) as client:
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        ref = registry.add_tokenizer(word_tokenizer_json, "words")
        registry.create_key("a", ref)
        registry.create_key("b", ref)
        client.headers["Authorization"] = "Bearer " + registry.tokens.create("admin", "t", actor="test").token
        yield client


def _calibrate(registry, key_id: str) -> None:
    registry.calibrations.add(
        key_id,
        corpus_sha256="c" * 64,
        alpha=0.01,
        n_scored=2000,
        n_flagged=19,
        report={"fpr": {"rate": 0.0095}},
        actor="test",
    )


def test_show_key_reports_the_newest_calibration_with_its_corpus_and_date(client):
    registry = client.app.state.service.registry
    key = registry.list_keys()[0]
    shown = client.get(f"/v1/keys/{key.key_id}").json()
    assert shown["calibration"] is None and shown["key_id"] == key.key_id
    _calibrate(registry, key.key_id)
    calibration = client.get(f"/v1/keys/{key.key_id}").json()["calibration"]
    assert calibration["corpus_sha256"] == "c" * 64 and calibration["created_at"].startswith("20")
    assert (calibration["n_scored"], calibration["n_flagged"], calibration["stale"]) == (2000, 19, False)
    assert calibration["report"] == {"fpr": {"rate": 0.0095}}
    assert client.get("/v1/keys/wk_nosuchkey").status_code == 404


def test_detection_names_the_keys_never_calibrated_or_stale(client):
    service = client.app.state.service
    registry = service.registry
    a, b = (k.key_id for k in registry.list_keys())
    detect = {"text": "w1 w2 w3 w4 w5 w6"}
    answer = client.post("/v1/detect", json=detect).json()
    assert answer["calibration_warnings"] == [
        {"key_id": a, "state": "uncalibrated"},
        {"key_id": b, "state": "uncalibrated"},
    ]
    _calibrate(registry, a)
    service.calibration_states.forget()  # as after its time to live
    answer = client.post("/v1/detect/batch", json={"items": [detect]}).json()["results"][0]
    assert answer["calibration_warnings"] == [{"key_id": b, "state": "uncalibrated"}]
    _calibrate(registry, b)
    service.calibration_states.forget()
    assert "calibration_warnings" not in client.post("/v1/detect", json=detect).json()
    spec = WatermarkSpec.from_dict({**registry.get(a).spec.to_dict(), "min_scored_tokens": 20}).to_json()
    with registry.sessions.begin() as session:
        session.execute(update(Key).where(Key.id == a).values(spec=spec))
    service.calibration_states.forget()
    answer = client.post("/v1/detect", json={**detect, "key_ids": [a]}).json()
    assert answer["calibration_warnings"] == [{"key_id": a, "state": "stale"}]


class _CountingStore:
    def __init__(self) -> None:
        self.reads = 0
        self.states_now = {"k1": "uncalibrated", "k2": "calibrated"}

    def states(self, key_ids):
        self.reads += 1
        return {k: self.states_now[k] for k in key_ids if k in self.states_now}


def test_the_states_are_read_once_per_time_to_live_and_for_keys_not_seen_before():
    store, now = _CountingStore(), [0.0]
    states = CalibrationStates(store, ttl=30.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert states.warnings(["k1", "k2"]) == [{"key_id": "k1", "state": "uncalibrated"}]
    for _ in range(100):
        states.warnings(["k1", "k2"])
    assert store.reads == 1
    store.states_now["k1"] = "calibrated"
    now[0] = 29.9
    assert states.warnings(["k1"]) == [{"key_id": "k1", "state": "uncalibrated"}] and store.reads == 1
    now[0] = 30.0
    assert states.warnings(["k1"]) == [] and store.reads == 2
    store.states_now["k3"] = "stale"
    assert states.warnings(["k3"]) == [{"key_id": "k3", "state": "stale"}] and store.reads == 3
