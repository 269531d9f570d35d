"""Receipts from the service: `receipt: true` on both doors of /v1/detect and on the batch, the
public key set at GET /v1/receipts/keys, rotation and revocation as a verifier sees them."""

from __future__ import annotations

from collections.abc import Iterator

import fastapi
import numpy as np
import pytest
from fastapi.testclient import TestClient

from wmark.api import Settings, create_app
from wmark.api.deps import get_service
from wmark.jwk import read_jwks
from wmark.keys import KeyRegistry
from wmark.receipts import token_ids_sha256, verify_receipt


class Api:
    def __init__(self, client: TestClient, registry: KeyRegistry, token: str, key_id: str) -> None:
        self.client, self.registry, self.key_id = client, registry, key_id
        self.headers = {"Authorization": f"Bearer {token}"}

    def detect(self, body: dict, path: str = "/v1/detect") -> dict:
        resp = self.client.post(path, headers=self.headers, json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def keys(self):
        resp = self.client.get("/v1/receipts/keys")  # no token: the key set is public
        assert resp.status_code == 200, resp.text
        assert resp.headers["cache-control"] == "public, max-age=60"
        return read_jwks(resp.content)


@pytest.fixture()
def api(registry_config, word_tokenizer_json) -> Iterator[Api]:
    settings = Settings(registry=registry_config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    with TestClient(create_app(settings)) as client:
        reg = client.app.state.service.registry
        key = reg.create_key("k", reg.add_tokenizer(word_tokenizer_json, "words"))
        yield Api(client, reg, reg.tokens.create("detector", "t", actor="test").token, key.key_id)


def _text(api: Api, planted, seed: int) -> str:
    ids = planted(api.registry.material(api.key_id), 200, np.random.default_rng(seed))
    return " ".join(f"w{i - 1}" for i in ids)


@pytest.fixture()
def solved(monkeypatch) -> list[int]:
    """One item per request that went through FastAPI's route handler (not the fast door)."""
    calls: list[int] = []
    solve = fastapi.routing.solve_dependencies

    async def counting(*args, **kwargs):
        calls.append(1)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


@pytest.mark.parametrize("door", ["fast", "route"])
def test_a_detection_with_receipt_true_verifies_against_the_public_keys(api, planted, solved, door):
    if door == "route":
        api.client.app.dependency_overrides[get_service] = get_service  # shuts the fast door
    text = _text(api, planted, seed=1)
    plain = api.detect({"text": text})
    assert "receipt" not in plain  # only when asked for
    body = api.detect({"text": text, "receipt": True})
    assert (len(solved) > 0) == (door == "route")
    report = verify_receipt(body["receipt"], api.keys(), text=text.encode())
    assert report.ok, report.reason
    payload = report.payload
    row = api.registry.audit.page(limit=1, action="detect")[0]  # the first receipt created the key after it
    assert payload["audit_seq"] == body["audit_seq"] == row.seq
    assert payload["input"] == {"kind": "text", "sha256": row.text_sha256}
    assert payload["key"]["id"] == body["key_id"] == api.key_id
    assert payload["key"]["fingerprint"] == api.registry.get(api.key_id).fingerprint
    detection = payload["detection"]
    assert detection["verdict"] == "watermarked" and float(detection["log_p"]) == body["log_p"]
    assert detection["n_scored"] == body["n_scored"] and float(detection["score"]) == body["score"]
    assert payload["issuer"] == api.client.app.state.service.settings.receipt_issuer
    assert not verify_receipt(body["receipt"], api.keys(), text=(text + " ").encode()).ok


def test_batch_receipts_one_per_item_and_token_ids_with_a_prompt(api, planted):
    ids = planted(api.registry.material(api.key_id), 150, np.random.default_rng(3))
    texts = [_text(api, planted, seed=2), "w1 w2 w3"]
    items = [{"text": t} for t in texts] + [{"token_ids": ids[4:], "prompt_ids": ids[:4]}]
    results = api.detect({"items": items, "receipt": True}, path="/v1/detect/batch")["results"]
    keys = api.keys()
    assert len({r["receipt"] for r in results}) == 3
    for text, result in zip(texts, results, strict=False):
        report = verify_receipt(result["receipt"], keys, text=text.encode())
        assert report.ok and report.payload["audit_seq"] == result["audit_seq"], report.reason
    assert [r["verdict"] for r in results[:2]] == ["watermarked", "insufficient_evidence"]
    last = verify_receipt(results[2]["receipt"], keys, token_ids=ids[4:], prompt_ids=ids[:4])
    assert last.ok and last.payload["input"]["kind"] == "prompt_and_token_ids", last.reason
    assert last.payload["input"]["sha256"] == token_ids_sha256(ids[4:], ids[:4])
    assert not verify_receipt(results[2]["receipt"], keys, token_ids=ids).ok  # the prompt is part of it


def test_rotation_keeps_receipts_valid_and_revocation_is_published(api, planted):
    text = _text(api, planted, seed=4)
    first = api.detect({"text": text, "receipt": True})["receipt"]
    old_kid = verify_receipt(first, api.keys()).payload["kid"]
    api.registry.receipt_keys.rotate(actor="test")
    second = api.detect({"text": text, "receipt": True})["receipt"]
    keys = api.keys()
    assert verify_receipt(second, keys).payload["kid"] != old_kid
    assert keys[old_kid].status == "retired" and verify_receipt(first, keys).ok
    api.registry.receipt_keys.revoke(old_kid, actor="test")
    keys = api.keys()
    report = verify_receipt(first, keys)
    assert not report.ok and report.reason.startswith("signed by a revoked key")
    assert keys[old_kid].revoked_at is not None and verify_receipt(second, keys).ok
    actions = [r.action for r in api.registry.audit.tail(10) if r.action.startswith("receipt_key")]
    assert actions == ["receipt_key_create", "receipt_key_rotate", "receipt_key_revoke"]


def test_the_receipt_routes_are_in_the_openapi_document(api):
    schema = api.client.get("/openapi.json").json()
    assert "/v1/receipts/keys" in schema["paths"]
    components = schema["components"]["schemas"]
    assert "receipt" in components["DetectRequest"]["properties"]
    assert "receipt" in components["BatchRequest"]["properties"]
    assert "receipt" in components["DetectResponse"]["properties"]
