"""The service and the master key: a key sealed under another master key is left out of detection
(named in each answer) instead of a 500, a wrong master key writes nothing and fails /readyz,
a damaged registry file is a 503."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from wmark.api import Settings, create_app
from wmark.keys import KeyRegistry, MasterKey, RegistryConfig
from wmark.keys.models import Key, utcnow

GOOD = base64.b64encode(hashlib.sha256(b"good").digest()).decode()
OTHER = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
FOREIGN = "wk_f0f0f0f0f0f0"


def _as(config: RegistryConfig, master: str) -> RegistryConfig:
    return RegistryConfig(home=config.home, database_url=config.database_url, master_key=master)


def _client(config: RegistryConfig) -> TestClient:
    settings = Settings(registry=config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    return TestClient(create_app(settings))


@pytest.fixture()
def good(registry_config, word_tokenizer_json) -> Iterator[TestClient]:
    """The service under the registry's master key, with one key of its own and an admin token."""
    with _client(_as(registry_config, GOOD)) as client:
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        registry.create_key("k", registry.add_tokenizer(word_tokenizer_json, "words"))
        client.headers["Authorization"] = "Bearer " + registry.tokens.create("admin", "t", actor="test").token
        yield client


def _plant_foreign_key(registry: KeyRegistry, like: str) -> None:
    """An active key sealed under OTHER, as a rotation under a wrong master key left it before the
    check existed."""
    foreign = MasterKey(hashlib.sha256(b"other").digest())
    with registry.sessions.begin() as session:
        model = session.get(Key, like)
        session.add(
            Key(
                id=FOREIGN,
                name="k",
                status="active",
                spec=model.spec,
                fingerprint="0" * 16,
                tokenizer_sha256=model.tokenizer_sha256,
                secret_ciphertext=foreign.seal(b"s" * 32, FOREIGN.encode()),
                master_key_id=foreign.key_id,
                created_at=utcnow(),
            )
        )


def _marked(registry: KeyRegistry, key_id: str, planted) -> str:
    ids = planted(registry.material(key_id), 200, np.random.default_rng(5))
    return " ".join(f"w{i - 1}" for i in ids)


def test_detection_leaves_out_a_key_sealed_under_another_master_key(good, planted):
    registry = good.app.state.service.registry
    mine = registry.list_keys()[0].key_id
    text = _marked(registry, mine, planted)
    assert good.post("/v1/detect", json={"text": text}).status_code == 200  # detectors built
    _plant_foreign_key(registry, mine)
    for body in ({"text": text}, {"text": text, "key_ids": [FOREIGN, mine]}):
        resp = good.post("/v1/detect", json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["verdict"] == "watermarked" and answer["key_id"] == mine
        assert [s["key_id"] for s in answer["skipped_keys"]] == [FOREIGN]
        assert answer["skipped_keys"][0]["code"] == "key_unavailable"
        assert "sealed under master key" in answer["skipped_keys"][0]["message"]
    batch = good.post("/v1/detect/batch", json={"items": [{"text": text}, {"text": "w1 w2"}]})
    assert batch.status_code == 200, batch.text
    assert all(r["skipped_keys"][0]["key_id"] == FOREIGN for r in batch.json()["results"])
    named = good.post("/v1/detect", json={"text": text, "key_ids": [mine]})
    assert named.status_code == 200 and "skipped_keys" not in named.json()
    only_foreign = good.post("/v1/detect", json={"text": text, "key_ids": [FOREIGN]})
    assert only_foreign.status_code == 409 and only_foreign.json()["code"] == "key_unavailable"
    not_ready = good.get("/readyz")
    assert not_ready.status_code == 503 and FOREIGN in not_ready.json()["message"]
    good.post(f"/v1/keys/{FOREIGN}/revoke")
    assert good.get("/readyz").status_code == 200


def test_under_a_wrong_master_key_nothing_is_written_and_the_service_is_not_ready(
    good, registry_config, planted
):
    registry = good.app.state.service.registry
    mine = registry.list_keys()[0].key_id
    text = _marked(registry, mine, planted)
    token = good.headers["Authorization"]
    with _client(_as(registry_config, OTHER)) as wrong:
        wrong.headers["Authorization"] = token
        ready = wrong.get("/readyz")
        assert ready.status_code == 503 and "not this registry's" in ready.json()["message"]
        for path in ("/v1/keys", f"/v1/keys/{mine}/rotate"):
            body = {"name": "k2", "tokenizer_sha256": registry.get(mine).spec.tokenizer.sha256}
            resp = wrong.post(path, json=body)
            assert resp.status_code == 503 and resp.json()["code"] == "wrong_master_key", resp.text
            assert OTHER not in resp.text and GOOD not in resp.text
        detect = wrong.post("/v1/detect", json={"text": text})
        assert detect.status_code == 503 and detect.json()["code"] == "wrong_master_key"
    assert [k.key_id for k in registry.list_keys("active")] == [mine]  # nothing written
    assert good.post("/v1/detect", json={"text": text}).json()["verdict"] == "watermarked"
    assert good.get("/readyz").status_code == 200


def test_a_damaged_registry_file_is_a_503(tmp_path):
    db = tmp_path / "wmark.db"
    db.write_bytes(bytes(range(256)) * 32)
    config = RegistryConfig(home=tmp_path, database_url=f"sqlite:///{db}", master_key=GOOD)
    with TestClient(create_app(Settings(registry=config))) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["message"] == "the registry database is damaged"
        token = {"Authorization": "Bearer wmt_000000000000_" + "a" * 43}
        resp = client.post("/v1/detect", headers=token, json={"text": "w1 w2"})
        assert resp.status_code == 503 and resp.json()["code"] == "registry_damaged", resp.text
