"""The REST API in process (TestClient, lifespan included) on SQLite and PostgreSQL.

Auth and roles on every route, detection results and their audit rows, key administration,
error shapes and limits, metrics, readiness, the detector cache, and no secret in any output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import anyio
import fastapi.routing
import numpy as np
import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.testclient import TestClient
from sqlalchemy import text as sql_text

from wmark.api import Settings, create_app, detect_routes, fast_detect
from wmark.api.deps import get_service
from wmark.api.generate_settings import GenerationSettings
from wmark.detector import Detector, normalize, readings
from wmark.keys import KeyInfo, KeyRegistry, RegistryConfig
from wmark.keys.tokens import ROLES

PUBLIC = {"/healthz", "/readyz", "/", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/v1/receipts/keys"}
# which roles each route admits (admin may do everything)
ALLOWED = {
    "/v1/detect": {"detector", "admin"},
    "/v1/detect/batch": {"detector", "admin"},
    "/v1/keys": {"admin"},
    "/v1/vllm-keys": {"admin"},
    "/v1/keys/{key_id}": {"admin"},
    "/v1/keys/{key_id}/rotate": {"admin"},
    "/v1/keys/{key_id}/revoke": {"admin"},
    "/v1/audit": {"auditor", "admin"},
    "/v1/audit/verify": {"auditor", "admin"},
    "/metrics": {"auditor", "admin"},
}


@dataclass
class Api:
    client: TestClient
    registry: KeyRegistry
    key: KeyInfo
    tokens: dict[str, str]

    def call(self, method: str, path: str, role: str | None = "detector", **kwargs):
        headers = kwargs.pop("headers", {})
        if role is not None:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return self.client.request(method, path, headers=headers, **kwargs)

    def text(self, seed: int, n: int = 200, planted=None) -> str:
        ids = planted(self.registry.material(self.key.key_id), n, np.random.default_rng(seed))
        return " ".join(f"w{i - 1}" for i in ids)


def _settings(config: RegistryConfig, **overrides) -> Settings:
    base = Settings(
        registry=config,
        migrate=True,
        rate_per_second=1000.0,
        rate_burst=1000,
        auth_fail_per_second=1000.0,
        auth_fail_burst=1000,
    )
    return replace(base, **overrides)


@pytest.fixture()
def make_api(registry_config, word_tokenizer_json):
    clients = []

    def make(**overrides) -> Api:
        app = create_app(_settings(registry_config, **overrides))
        client = TestClient(app)
        client.__enter__()  # runs the lifespan: opens (and migrates) the registry
        clients.append(client)
        reg = app.state.service.registry
        ref = reg.add_tokenizer(word_tokenizer_json, "words")
        key = reg.list_keys("active")[0] if reg.list_keys("active") else reg.create_key("k", ref)
        tokens = {role: reg.tokens.create(role, f"{role}-test", actor="test").token for role in ROLES}
        return Api(client, reg, key, tokens)

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture()
def api(make_api) -> Iterator[Api]:
    yield make_api()


def test_detect_matches_the_library_and_is_audited(api, planted, word_tokenizer_json):
    text = api.text(1, planted=planted)
    resp = api.call("POST", "/v1/detect", json={"text": text})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    expected = Detector(api.registry.detection_keys(), {api.key.spec.tokenizer.sha256: word_tokenizer_json})
    direct = expected.detect(text).to_dict(include_tokens=False)
    assert {k: body[k] for k in direct} == direct  # the same fields and values as `wmark detect --json`
    assert body["verdict"] == "watermarked" and body["p_value"] < 1e-6 and "tokens" not in body
    row = api.registry.audit.tail(1)[0]
    assert row.seq == body["audit_seq"] and row.action == "detect"
    assert row.text_sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert row.actor.startswith("token:") and row.key_ids == (api.key.key_id,)
    assert row.result["verdict"] == "watermarked" and row.result["p_value"] == body["p_value"]

    plain = " ".join(f"w{i}" for i in np.random.default_rng(2).integers(0, 500, size=200))
    assert api.call("POST", "/v1/detect", json={"text": plain}).json()["verdict"] == "not_detected"
    short = api.call("POST", "/v1/detect", json={"text": "w1 w2 w3"}).json()
    assert short["verdict"] == "insufficient_evidence"


def test_token_ids_input_and_per_token_evidence(api, planted):
    ids = planted(api.registry.material(api.key.key_id), 150, np.random.default_rng(4))
    text = " ".join(f"w{i - 1}" for i in ids)
    by_ids = api.call("POST", "/v1/detect", json={"token_ids": ids, "return_tokens": True}).json()
    by_text = api.call("POST", "/v1/detect", json={"text": text, "return_tokens": True}).json()
    assert by_ids["p_value"] == by_text["p_value"] and by_ids["verdict"] == "watermarked"
    tokens = by_text["tokens"]
    assert [t["token_id"] for t in tokens] == ids
    assert all(text[t["start"] : t["end"]] == f"w{t['token_id'] - 1}" for t in tokens)
    scored = [t for t in tokens if t["pivot"] is not None]
    assert len(scored) == by_text["n_scored"]
    assert sum(t["score"] for t in scored) == pytest.approx(by_text["score"], rel=1e-9)
    assert by_ids["tokens"][0]["start"] is None  # no text, no offsets
    assert api.registry.audit.tail(2)[0].result["input"] == "token_ids"


def test_batch_keeps_order_and_audits_each_item(api, planted):
    texts = [api.text(s, planted=planted) for s in (5, 6)] + ["w1 " * 50]
    items = [{"text": t, "source": f"doc-{i}"} for i, t in enumerate(texts)]
    resp = api.call("POST", "/v1/detect/batch", json={"items": items, "alpha": 0.001})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["source"] for r in results] == ["doc-0", "doc-1", "doc-2"]
    assert [r["verdict"] for r in results] == ["watermarked", "watermarked", "insufficient_evidence"]
    rows = api.registry.audit.tail(3)
    assert [r.seq for r in rows] == [r["audit_seq"] for r in results]
    assert [r.text_sha256 for r in rows] == [hashlib.sha256(t.encode()).hexdigest() for t in texts]


def _request_for(path: str, api: Api) -> tuple[str, str, dict]:
    concrete = path.replace("{key_id}", api.key.key_id)
    if path == "/v1/detect":
        return "POST", concrete, {"json": {"text": "w1 w2"}}
    if path == "/v1/detect/batch":
        return "POST", concrete, {"json": {"items": [{"text": "w1 w2"}]}}
    if path == "/v1/keys":
        return "GET", concrete, {}
    if path.endswith(("/rotate", "/revoke")):
        return "POST", concrete, {}
    if path == "/v1/vllm-keys":
        return (
            "POST",
            concrete,
            {"json": {"name": "v", "tokenizer_sha256": "0" * 64, "watermark_config": {"key": 1}}},
        )
    return "GET", concrete, {}


def test_every_endpoint_but_health_and_page_needs_a_token_of_the_right_role(api):
    routes = set(api.client.app.openapi()["paths"])  # every API route (the page is not in the schema)
    protected = routes - PUBLIC
    assert protected == set(ALLOWED), "a new route needs an entry in ALLOWED"
    for path in sorted(protected):
        method, url, kwargs = _request_for(path, api)
        for header in ({}, {"Authorization": "Bearer nonsense"}, {"Authorization": "Basic dXNlcjpwdw=="}):
            resp = api.call(method, url, role=None, headers=dict(header), **kwargs)
            assert resp.status_code == 401, (path, header, resp.text)
            assert resp.json()["code"] == "unauthorized"
            assert resp.headers["www-authenticate"].startswith("Bearer")
        for role in ("detector", "auditor"):  # admin is allowed everywhere; rotate/revoke change state
            resp = api.call(method, url, role=role, **kwargs)
            if role in ALLOWED[path]:
                assert resp.status_code not in (401, 403), (path, role, resp.text)
            else:
                assert resp.status_code == 403, (path, role, resp.text)
                assert resp.json()["code"] == "forbidden"
    for path in ("/healthz", "/readyz", "/"):
        assert api.call("GET", path, role=None).status_code == 200
    failed = api.registry.audit.page(limit=1000, action="auth_failed")
    reasons = {r.result["reason"] for r in failed}
    assert reasons == {"missing", "malformed", "forbidden"}
    forbidden = next(r for r in failed if r.result["reason"] == "forbidden")
    assert forbidden.actor.startswith("token:") and forbidden.result["status"] == 403
    assert all(r.result["path"].startswith(("/v1/", "/metrics")) for r in failed)


def test_admin_may_do_everything(api, planted):
    text = api.text(7, planted=planted)
    assert api.call("POST", "/v1/detect", role="admin", json={"text": text}).status_code == 200
    assert api.call("GET", "/v1/audit", role="admin").status_code == 200
    assert api.call("GET", "/metrics", role="admin").status_code == 200


def test_key_administration(api, planted):
    listed = api.call("GET", "/v1/keys", role="admin").json()["keys"]
    assert [k["key_id"] for k in listed] == [api.key.key_id]
    created = api.call(
        "POST",
        "/v1/keys",
        role="admin",
        json={"name": "second", "tokenizer_sha256": api.key.spec.tokenizer.sha256, "context_width": 3},
    )
    assert created.status_code == 201, created.text
    new = created.json()
    assert new["status"] == "active" and new["spec"]["context_width"] == 3
    assert api.call("GET", f"/v1/keys/{new['key_id']}", role="admin").json() == {**new, "calibration": None}
    rotated = api.call("POST", f"/v1/keys/{api.key.key_id}/rotate", role="admin").json()
    assert rotated["replaces"] == api.key.key_id
    revoked = api.call("POST", f"/v1/keys/{new['key_id']}/revoke", role="admin").json()
    assert revoked["status"] == "revoked"
    statuses = {k["key_id"]: k["status"] for k in api.call("GET", "/v1/keys", role="admin").json()["keys"]}
    assert statuses == {api.key.key_id: "retired", new["key_id"]: "revoked", rotated["key_id"]: "active"}
    assert (
        api.call("GET", "/v1/keys?status=active", role="admin").json()["keys"][0]["key_id"]
        == rotated["key_id"]
    )
    admin_id = api.tokens["admin"].split("_")[1]
    rows = [r for r in api.registry.audit.tail(10) if r.action.startswith("key_") and r.actor != "local"]
    assert [(r.action, r.actor) for r in rows] == [
        ("key_create", f"token:{admin_id}"),
        ("key_rotate", f"token:{admin_id}"),
        ("key_revoke", f"token:{admin_id}"),
    ]
    # the retired key still detects; the revoked one is refused by name
    text = api.text(8, planted=planted)
    body = api.call("POST", "/v1/detect", json={"text": text}).json()
    assert body["verdict"] == "watermarked" and body["key_id"] == api.key.key_id
    assert {k["key_id"] for k in body["keys"]} == {api.key.key_id, rotated["key_id"]}
    refused = api.call("POST", "/v1/detect", json={"text": text, "key_ids": [new["key_id"]]})
    assert refused.status_code == 409 and refused.json()["code"] == "key_revoked"
    missing_tok = api.call("POST", "/v1/keys", role="admin", json={"name": "x", "tokenizer_sha256": "0" * 64})
    assert missing_tok.status_code == 404 and missing_tok.json()["code"] == "tokenizer_not_found"


def test_detector_is_cached_and_rebuilt_when_keys_change(api, planted, monkeypatch):
    import wmark.api.detectors as detectors

    parsed = []
    real = detectors.TextTokenizer

    class Counting(real):
        def __init__(self, *args, **kwargs):
            parsed.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(detectors, "TextTokenizer", Counting)
    cache = api.client.app.state.service.detectors
    text = api.text(9, planted=planted)
    for _ in range(5):
        assert api.call("POST", "/v1/detect", json={"text": text}).status_code == 200
    assert cache.builds == 1 and len(parsed) == 1
    api.call("POST", f"/v1/keys/{api.key.key_id}/rotate", role="admin")
    for _ in range(3):
        api.call("POST", "/v1/detect", json={"text": text})
    assert cache.builds == 2 and len(parsed) == 1  # same tokenizer: parsed once per process
    # a change made by another process (here: directly in the registry) is seen too
    api.registry.revoke(api.key.key_id)
    body = api.call("POST", "/v1/detect", json={"text": text}).json()
    # The revoked key is no longer tried. (Not "verdict == not_detected": the successor's secret is
    # random, so the text is H0 under it and would be flagged in 1% of runs.)
    tried = [k["key_id"] for k in body["keys"]]
    assert cache.builds == 3 and len(tried) == 1 and api.key.key_id not in tried
    assert len(parsed) == 1


def test_keys_that_keep_changing_under_a_request_refuse_it_unanswered(api, planted, monkeypatch):
    import wmark.api.detectors as detectors

    attempts = []

    def changed(self, session) -> None:
        attempts.append(self.state)
        raise detectors.KeysChanged("the keys changed while this request was answered; send it again")

    monkeypatch.setattr(detectors.KeySet, "unchanged", changed)
    detected = len(api.registry.audit.page(limit=100, action="detect"))
    refused = api.call("POST", "/v1/detect", json={"text": api.text(9, planted=planted)})
    assert refused.status_code == 409 and refused.json()["code"] == "keys_changed"
    assert len(attempts) == 3  # detected again with freshly read keys, twice, then refused
    assert len(api.registry.audit.page(limit=100, action="detect")) == detected  # no answer audited


def test_detector_is_built_at_start_up(registry_config, word_tokenizer_json):
    with KeyRegistry.open(registry_config) as reg:
        reg.create_key("k", reg.add_tokenizer(word_tokenizer_json, "words"))
    tables = (normalize._ascii_fold, readings._invisible)
    tables += (readings._mixed_word_bmp, readings._mixed_word_astral)
    for table in tables:  # earlier tests in this process may have built them
        table.cache_clear()
    with TestClient(create_app(_settings(registry_config))) as client:
        cache = client.app.state.service.detectors
        assert cache.builds == 1  # before any request: no first-request latency spike
        detector = cache.get().detector
        tokenizer = detector.tokenizer(detector.keys[0].spec.tokenizer.sha256)
        assert "splice_tables" in vars(tokenizer)  # built (None for this tokenizer), not on a request
        assert all(table.cache_info().currsize == 1 for table in tables)  # the normaliser's too
        assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param({}, 422, "validation_error", id="no-input"),
        pytest.param({"text": "w1", "token_ids": [1]}, 422, "validation_error", id="both-inputs"),
        pytest.param({"text": "w1 w2", "alpha": 1.5}, 422, "validation_error", id="alpha"),
        pytest.param({"text": "w1 w2", "alpha": 0}, 422, "validation_error", id="alpha-zero"),
        pytest.param({"text": "w1 w2", "extra": 1}, 422, "validation_error", id="unknown-field"),
        pytest.param(b'{"text": "\\ud800 w1"}', 422, "validation_error", id="lone-surrogate"),
        pytest.param({"text": "   "}, 422, "validation_error", id="blank"),  # the schema says so
        pytest.param({"token_ids": []}, 422, "validation_error", id="no-ids"),
        pytest.param({"token_ids": [-1]}, 422, "validation_error", id="negative-id"),
        pytest.param({"token_ids": [10**6]}, 422, "tokenizer_error", id="id-outside-vocab"),
        pytest.param({"text": "w1 w2", "key_ids": ["wk_nope"]}, 404, "key_not_found", id="unknown-key"),
        pytest.param({"text": "w1 w2", "key_ids": ["bad id!"]}, 422, "validation_error", id="bad-key-id"),
        pytest.param({"text": "w1 " * 3000}, 413, "text_too_long", id="text-too-long"),
        pytest.param({"token_ids": [1] * 3000}, 413, "text_too_long", id="ids-too-long"),
        # strict types: no coercion of booleans, numeric strings or "yes"
        pytest.param({"token_ids": [True, False]}, 422, "validation_error", id="bool-ids"),
        pytest.param({"token_ids": ["1", "2"]}, 422, "validation_error", id="string-ids"),
        pytest.param({"text": "w1 w2", "alpha": "0.05"}, 422, "validation_error", id="string-alpha"),
        pytest.param({"text": "w1 w2", "return_tokens": "yes"}, 422, "validation_error", id="yes-flag"),
        pytest.param({"text": "w1 w2", "return_tokens": 1}, 422, "validation_error", id="int-flag"),
        # null is not "absent" (the schema allows neither)
        pytest.param({"text": None, "token_ids": [1]}, 422, "validation_error", id="null-text"),
        pytest.param({"text": "w1", "source": None}, 422, "validation_error", id="null-source"),
    ],
)
def test_bad_input_gets_a_json_4xx(make_api, body, status, code):
    api = make_api(max_text_chars=2000)
    if isinstance(body, bytes):  # JSON that a client library would refuse to produce
        resp = api.call("POST", "/v1/detect", content=body, headers={"Content-Type": "application/json"})
    else:
        resp = api.call("POST", "/v1/detect", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert set(err) == {"code", "message"} and err["code"] == code
    assert "w1 w1 w1" not in err["message"]  # input is not echoed


def test_limits_and_protocol_errors(make_api):
    api = make_api(max_body_bytes=4096, max_batch_items=2, rate_per_second=0.001, rate_burst=3)
    big = api.call("POST", "/v1/detect", json={"text": "w1 " * 3000})
    assert big.status_code == 413 and big.json()["code"] == "body_too_large"
    chunked = api.call(
        "POST",
        "/v1/detect",
        content=iter([b'{"text": "', b"w1 " * 2000, b'"}']),
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 413
    batch = api.call("POST", "/v1/detect/batch", json={"items": [{"text": "w1"}] * 3})
    assert batch.status_code == 413 and batch.json()["code"] == "text_too_long"
    # the batch above took one of the detector token's 3; two more pass, the next is limited
    assert [api.call("POST", "/v1/detect", json={"text": "w1 w2"}).status_code for _ in range(2)] == [200] * 2
    limited = api.call("POST", "/v1/detect", json={"text": "w1 w2"})
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert api.call("GET", "/v1/audit", role="auditor").status_code == 200  # other tokens unaffected
    wrong_method = api.call("DELETE", "/v1/detect", role="auditor")
    assert wrong_method.status_code == 405 and wrong_method.json()["code"] == "method_not_allowed"
    unknown = api.call("GET", "/v2/nothing", role=None)
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


def test_invalid_json_is_422_and_authentication_comes_before_validation(api):
    resp = api.call("POST", "/v1/detect", content=b'{"text": ', headers={"Content-Type": "application/json"})
    assert resp.status_code == 422 and resp.json()["code"] == "validation_error"
    assert api.call("POST", "/v1/detect", role=None, json={}).status_code == 401
    assert api.call("POST", "/v1/detect", role="auditor", json={"alpha": 7}).status_code == 403


def test_failed_authentication_flood_is_rate_limited(make_api):
    api = make_api(auth_fail_per_second=0.001, auth_fail_burst=5)
    statuses = [api.call("GET", "/v1/audit", role=None).status_code for _ in range(8)]
    assert statuses == [401] * 5 + [429] * 3
    assert len(api.registry.audit.page(limit=100, action="auth_failed")) == 5


def test_audit_routes(api, planted):
    for seed in range(3):
        api.call("POST", "/v1/detect", json={"text": api.text(seed, n=40, planted=planted)})
    page = api.call("GET", "/v1/audit?limit=2&action=detect", role="auditor").json()
    assert [e["action"] for e in page["events"]] == ["detect", "detect"]
    seqs = [e["seq"] for e in page["events"]]
    assert seqs == sorted(seqs, reverse=True) and page["next_before"] == seqs[-1]
    rest = api.call("GET", f"/v1/audit?limit=2&action=detect&before={page['next_before']}", role="auditor")
    assert len(rest.json()["events"]) == 1 and rest.json()["next_before"] is None
    verify = api.call("GET", "/v1/audit/verify", role="auditor").json()
    assert verify["ok"] and verify["rows"] == api.registry.audit.count()


def test_health_readiness_and_metrics(api, planted, tmp_path):
    assert api.call("GET", "/healthz", role=None).json() == {"status": "ok"}
    assert api.call("GET", "/readyz", role=None).json()["status"] == "ready"
    text = api.text(11, planted=planted)
    for _ in range(3):
        api.call("POST", "/v1/detect", json={"text": text})
    api.call("GET", "/v1/keys", role="detector")  # 403
    metrics = api.call("GET", "/metrics", role="auditor")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    lines = metrics.text.splitlines()
    assert 'wmark_http_requests_total{method="POST",route="/v1/detect",status="200"} 3.0' in lines
    assert 'wmark_detections_total{verdict="watermarked"} 3.0' in lines
    assert 'wmark_auth_failures_total{reason="forbidden"} 1.0' in lines
    assert 'wmark_http_request_duration_seconds_count{method="POST",route="/v1/detect"} 3.0' in lines
    assert "wmark_detector_builds_total 1.0" in lines


def test_readiness_fails_without_a_database(tmp_path):
    down = RegistryConfig(home=tmp_path, database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    with TestClient(create_app(Settings(registry=down))) as client:
        assert client.get("/healthz").status_code == 200
        resp = client.get("/readyz")
        assert resp.status_code == 503 and resp.json()["code"] == "not_ready"
        token = {"Authorization": "Bearer wmt_000000000000_" + "a" * 43}
        down_detect = client.post("/v1/detect", headers=token, json={"text": "w1 w2"})
        assert down_detect.status_code == 503 and down_detect.json()["code"] == "database_unavailable"
        assert "127.0.0.1" not in down_detect.text  # driver messages stay in the server log
    unmigrated = RegistryConfig(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'empty.db'}")
    with TestClient(create_app(Settings(registry=unmigrated))) as client:
        resp = client.get("/readyz")
        assert resp.status_code == 503 and "wmark migrate" in resp.json()["message"]


def test_page_is_self_contained(api):
    resp = api.call("GET", "/", role=None)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    html = resp.text
    # nothing is loaded from anywhere: no src/href but inline data, no URL at all
    assert re.findall(r'(?:src|href)="([^"]*)"', html) == ["data:,"]
    assert "http://" not in html and "https://" not in html and "@import" not in html
    csp = resp.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "'unsafe-inline'" not in csp


def test_no_secret_in_any_response_or_log(api, planted, caplog):
    caplog.set_level(logging.DEBUG)
    text = api.text(12, planted=planted)
    bodies = []
    for role, method, path, kwargs in [
        ("detector", "POST", "/v1/detect", {"json": {"text": text, "return_tokens": True}}),
        ("admin", "GET", "/v1/keys", {}),
        ("admin", "GET", f"/v1/keys/{api.key.key_id}", {}),
        ("admin", "POST", f"/v1/keys/{api.key.key_id}/rotate", {}),
        ("auditor", "GET", "/v1/audit?limit=1000", {}),
        ("auditor", "GET", "/metrics", {}),
        ("detector", "GET", "/v1/audit", {}),  # 403
    ]:
        resp = api.call(method, path, role=role, **kwargs)
        bodies.append(resp.text + json.dumps(dict(resp.headers)))
    bodies.append(api.call("GET", "/v1/audit", role=None, headers={"Authorization": "Bearer wmt_x"}).text)
    bodies.append(api.client.get("/openapi.json").text)
    secrets = []
    for key in api.registry.detection_keys():
        raw = key.secret.reveal()
        secrets += [raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()]
    secrets.append(RegistryConfig.from_env().key_file.read_text().strip())  # the master key
    secrets += list(api.tokens.values()) + [t[17:] for t in api.tokens.values()]
    logs = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
    everything = "\n".join(bodies) + logs
    for secret in secrets:
        assert secret not in everything
    assert "secret" not in json.dumps(api.call("GET", "/v1/keys", role="admin").json())


def test_strict_types_still_accept_integral_alpha_and_json_floats(api):
    assert api.call("POST", "/v1/detect", json={"token_ids": [1, 2, 3], "alpha": 0.5}).status_code == 200
    assert api.call("POST", "/v1/detect", json={"text": "w1 w2", "alpha": 1}).status_code == 422  # range


def _exec(api: Api, sql: str, **params: object) -> None:
    with api.registry.engine.begin() as conn:
        conn.execute(sql_text(sql), params)


def test_a_damaged_audit_log_is_a_503_naming_it_never_a_500(api, planted):
    text = api.text(21, n=40, planted=planted)
    first = api.call("POST", "/v1/detect", json={"text": text}).json()["audit_seq"]
    _exec(api, "UPDATE audit_log SET result = 'not json' WHERE seq = :s", s=first)
    page = api.call("GET", "/v1/audit", role="auditor")
    assert page.status_code == 503 and page.json()["code"] == "audit_log_corrupt"
    assert f"audit row {first}" in page.json()["message"]
    verify = api.call("GET", "/v1/audit/verify", role="auditor")
    assert verify.status_code == 200 and verify.json()["first_bad_seq"] == first
    assert not verify.json()["ok"] and "not a JSON object" in verify.json()["reason"]
    # detection goes on (the damage is named by verify; new rows extend the chain)
    assert api.call("POST", "/v1/detect", json={"text": text}).status_code == 200

    _exec(api, "DELETE FROM audit_head")
    refused = api.call("POST", "/v1/detect", json={"text": text})
    assert refused.status_code == 503 and refused.json()["code"] == "audit_log_corrupt"
    assert "chain head" in refused.json()["message"]  # answered unaudited? never: refused, by name
    assert api.call("GET", "/v1/audit/verify", role="auditor").json()["ok"] is False
    assert api.call("GET", "/healthz", role=None).status_code == 200


def test_two_authorization_headers_are_rejected(api):
    detector = api.tokens["detector"]
    revoked = api.registry.tokens.create("detector", "to-revoke", actor="test")
    api.registry.tokens.revoke(revoked.info.token_id, actor="test")
    for second in (revoked.token, detector, api.tokens["admin"]):
        headers = [("Authorization", f"Bearer {detector}"), ("Authorization", f"Bearer {second}")]
        resp = api.client.post("/v1/detect", headers=headers, json={"text": "w1 w2"})
        assert resp.status_code == 401 and resp.json()["code"] == "unauthorized", second
    reasons = [r.result["reason"] for r in api.registry.audit.page(limit=10, action="auth_failed")]
    assert reasons == ["ambiguous"] * 3
    assert api.call("POST", "/v1/detect", json={"text": "w1 w2"}).status_code == 200  # one header: fine


def test_work_and_response_size_per_request_are_bounded(make_api, planted):
    api = make_api(max_text_chars=5000, max_request_chars=8000, max_response_tokens=300)
    text = api.text(22, n=200, planted=planted)  # ~1000 characters, 200 tokens
    rows = api.registry.audit.count()
    many = api.call("POST", "/v1/detect/batch", json={"items": [{"text": text}] * 9})
    assert many.status_code == 413 and "split the batch" in many.json()["message"]
    evidence = api.call(
        "POST", "/v1/detect/batch", json={"items": [{"text": text}] * 2, "return_tokens": True}
    )
    assert evidence.status_code == 413 and "return_tokens" in evidence.json()["message"]
    assert api.registry.audit.count() == rows  # refused answers are not audited as given
    assert api.call("POST", "/v1/detect/batch", json={"items": [{"text": text}] * 2}).status_code == 200
    one = api.call("POST", "/v1/detect", json={"text": text, "return_tokens": True})
    assert one.status_code == 200 and len(one.json()["tokens"]) == 200


def _asgi(api: Api, scope_path: str, messages: list[dict], *, settle: bool = False) -> list[dict]:
    """Run one HTTP request through the app (its lifespan already started) with a scripted
    `receive`; after the script, `receive` blocks (a stalled client) or says the client is gone."""
    sent: list[dict] = []
    scripted = iter(messages)

    async def receive() -> dict:
        message = next(scripted, None)
        if message is not None:
            return message
        if settle:
            return {"type": "http.disconnect"}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [
        (b"authorization", f"Bearer {api.tokens['detector']}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", b"100"),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": scope_path,
        "raw_path": scope_path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    api.client.portal.call(api.client.app, scope, receive, send)
    return sent


def test_stalled_bodies_time_out_and_vanished_clients_are_not_server_errors(make_api):
    api = make_api(body_timeout=0.2)
    partial = {"type": "http.request", "body": b'{"text": "w1', "more_body": True}
    # the stalled body is answered 408 (and the connection closed) once the timeout passes; what
    # bounds this test is that answer, not a clock
    sent = _asgi(api, "/v1/detect", [partial])
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["code"] == "request_timeout"
    # a client that disconnects mid-body gets no answer and is not counted as a server error
    assert _asgi(api, "/v1/detect", [partial], settle=True) == []
    lines = api.call("GET", "/metrics", role="auditor").text.splitlines()
    counted = [line for line in lines if line.startswith("wmark_http_requests_total")]
    assert 'wmark_http_requests_total{method="POST",route="/v1/detect",status="499"} 1.0' in lines, counted
    assert 'wmark_http_requests_total{method="POST",route="/v1/detect",status="408"} 1.0' in lines, counted
    assert not [line for line in lines if 'status="500"' in line or 'route="unmatched"' in line]


def test_a_bad_content_length_is_a_json_400(api):
    resp = api.call("POST", "/v1/detect", content=b"{}", headers={"Content-Length": "12x"})
    assert resp.status_code == 400 and resp.json()["code"] == "bad_request"


@pytest.mark.redis
@pytest.mark.parametrize("shared", [True, False], ids=["redis", "per-process"])
def test_rate_limits_per_token_are_shared_across_processes_through_redis(make_api, redis_url, shared):
    # two apps = two worker processes (each has its own limiter objects), one database
    limits = {"rate_per_second": 0.001, "rate_burst": 3, "redis_url": redis_url if shared else None}
    first, second = make_api(**limits), make_api(**limits)
    token = {"Authorization": f"Bearer {first.tokens['detector']}"}
    statuses = [
        app.client.post("/v1/detect", headers=token, json={"text": "w1 w2"}).status_code
        for app in (first, second) * 3
    ]
    # shared: 3 requests in all, whichever worker answers; per process: 3 in each
    assert statuses == ([200] * 3 + [429] * 3 if shared else [200] * 6)
    # another token has its own bucket
    other = {"Authorization": f"Bearer {first.tokens['admin']}"}
    assert second.client.post("/v1/detect", headers=other, json={"text": "w1 w2"}).status_code == 200


def test_a_cached_token_is_refused_as_soon_as_it_is_revoked(api, monkeypatch):
    token = {"Authorization": f"Bearer {api.tokens['detector']}"}
    assert api.client.post("/v1/detect", headers=token, json={"text": "w1 w2"}).status_code == 200
    queries = []
    monkeypatch.setattr(api.registry.tokens, "authenticate", lambda t: queries.append(t) or 1 / 0)
    # cached: the next detection does not authenticate against the database ...
    assert api.client.post("/v1/detect", headers=token, json={"text": "w1 w2"}).status_code == 200
    assert queries == []
    monkeypatch.undo()
    # ... yet a revocation committed by anyone (another process, the CLI) holds from then on
    token_id = api.tokens["detector"].split("_")[1]
    api.registry.tokens.revoke(token_id, actor="test")
    detected = len(api.registry.audit.page(limit=100, action="detect"))
    for _ in range(2):
        refused = api.client.post("/v1/detect", headers=token, json={"text": "w1 w2"})
        assert refused.status_code == 401 and "www-authenticate" in refused.headers
    assert len(api.registry.audit.page(limit=100, action="detect")) == detected  # nothing answered
    failed = api.registry.audit.page(limit=2, action="auth_failed")
    assert [r.result["reason"] for r in failed] == ["revoked", "revoked"]


@pytest.fixture()
def solved(monkeypatch) -> list[int]:
    """One item per request that went through FastAPI's dependency resolution (its route handler)."""
    calls: list[int] = []
    solve = fastapi.routing.solve_dependencies

    async def counting(*args, **kwargs):
        calls.append(1)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


def test_the_fast_door_answers_a_detection_without_fastapis_handler_and_hands_on_the_rest(api, solved):
    body = {"text": "w1 w2 w3 w4", "alpha": 0.05, "source": "doc-1"}
    first = api.call("POST", "/v1/detect", json=body)  # the token is not cached yet: admitted in a thread
    second = api.call("POST", "/v1/detect", json=body)  # cached: admitted on the event loop
    assert solved == []
    assert first.status_code == second.status_code == 200
    assert first.headers.items() == second.headers.items()  # content-length, -type, nosniff
    assert {**first.json(), "audit_seq": 0} == {**second.json(), "audit_seq": 0}
    assert second.json()["audit_seq"] == first.json()["audit_seq"] + 1
    metrics = api.call("GET", "/metrics", role="auditor").text
    assert 'wmark_http_requests_total{method="POST",route="/v1/detect",status="200"} 2.0' in metrics
    # what it does not admit goes to the FastAPI route, body and all: an +json media type, a bad body
    plus_json = api.call(
        "POST", "/v1/detect", content=json.dumps(body), headers={"Content-Type": "application/vnd.x+json"}
    )
    assert plus_json.status_code == 200 and solved
    routed = len(solved)
    bad = api.call("POST", "/v1/detect", json={**body, "alpha": "0.05"})
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error" and len(solved) > routed


def test_a_request_the_fast_door_hands_on_is_rate_limited_once(make_api):
    api = make_api(rate_per_second=0.001, rate_burst=3)
    assert api.call("POST", "/v1/detect", json={"text": "w1 w2"}).status_code == 200  # caches the token
    assert api.call("POST", "/v1/detect", json={"text": 7}).status_code == 422  # handed on: one token
    assert api.call("POST", "/v1/detect", json={"text": "w1 w2"}).status_code == 200  # the third
    limited = api.call("POST", "/v1/detect", json={"text": "w1 w2"})
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.headers["x-content-type-options"] == "nosniff"


def test_the_fast_door_is_open_and_does_what_the_route_of_the_app_does(registry_config):
    # Fails when the route of POST /v1/detect gains a dependency or parameter that the door
    # does not call (or loses one it calls), in create_app as it is, with generation on or off:
    # the door then stays shut (slower, the same answers) until `fast_detect.HONOURED` says how
    # it honours the new one. Middlewares need nothing: the door is a route, inside all of them.
    for generation in (None, GenerationSettings(target="embedded")):  # the models load in the lifespan
        app = create_app(_settings(registry_config), generation)
        assert fast_detect.differences(app) == [], generation
        assert isinstance(app.router.routes[0], fast_detect.FastDetectRoute)  # routed first


def test_a_dependency_the_fast_door_does_not_call_shuts_it(
    registry_config, word_tokenizer_json, monkeypatch, solved
):
    seen = []

    async def extra(request: Request) -> None:
        seen.append(request.url.path)

    guarded = APIRouter(dependencies=[Depends(extra)])  # as if detect_routes' router had gained it
    guarded.include_router(detect_routes.router)
    monkeypatch.setattr(detect_routes, "router", guarded)
    app = create_app(_settings(registry_config))
    assert fast_detect.differences(app) == ["the dependency extra"]
    with TestClient(app) as client:
        token = _detector_token(app, word_tokenizer_json)
        resp = client.post("/v1/detect", headers={"Authorization": f"Bearer {token}"}, json={"text": "w1 w2"})
    assert resp.status_code == 200 and seen == ["/v1/detect"] and solved  # the FastAPI route answered


def test_a_middleware_added_to_the_app_runs_around_the_fast_door(
    registry_config, word_tokenizer_json, solved
):
    seen = []

    class Stamp:  # any middleware added later
        def __init__(self, app) -> None:
            self.app = app

        async def __call__(self, scope, receive, send) -> None:
            async def stamped(message) -> None:
                if message["type"] == "http.response.start":
                    seen.append((scope["path"], message["status"]))
                    message["headers"] = [*message.get("headers", []), (b"x-stamp", b"1")]
                await send(message)

            await self.app(scope, receive, stamped)

    app = create_app(_settings(registry_config))
    app.add_middleware(Stamp)
    with TestClient(app) as client:
        token = _detector_token(app, word_tokenizer_json)
        for _ in range(2):  # uncached, then cached
            resp = client.post(
                "/v1/detect", headers={"Authorization": f"Bearer {token}"}, json={"text": "w1"}
            )
            assert resp.status_code == 200 and resp.headers["x-stamp"] == "1"
    assert seen == [("/v1/detect", 200)] * 2 and solved == []  # the door answered, inside the middleware


def _detector_token(app, word_tokenizer_json) -> str:
    reg = app.state.service.registry
    ref = reg.add_tokenizer(word_tokenizer_json, "words")
    if not reg.list_keys("active"):
        reg.create_key("k", ref)
    return reg.tokens.create("detector", "door-test", actor="test").token


# Each case: the roles of the Authorization headers of each request, in order; the statuses.
DOOR_CASES = {
    "no token": ([()], [401]),
    "two Authorization headers": ([("detector", "admin")], [401]),
    "wrong role": ([("auditor",)], [403]),
    "rate limited": ([("detector",), ("detector",)], [200, 429]),
    "good": ([("detector",)], [200]),
}


@pytest.mark.parametrize("case", DOOR_CASES)
def test_both_doors_answer_alike(make_api, solved, case):
    # the same requests through the fast door and through the FastAPI route (the door shut by a
    # dependency override that changes nothing): the same statuses, bodies, headers, audit rows
    # and metrics
    requests, statuses = DOOR_CASES[case]
    fast = _through_a_door(make_api(rate_per_second=0.001, rate_burst=1), requests, solved, shut=False)
    routed = _through_a_door(make_api(rate_per_second=0.001, rate_burst=1), requests, solved, shut=True)
    for part, by_door, by_route in zip(("answers", "audit rows", "metrics"), fast, routed, strict=True):
        assert by_door == by_route, part
    assert [status for status, _, _ in fast[0]] == statuses


def _through_a_door(api: Api, requests: list[tuple[str, ...]], solved: list[int], *, shut: bool):
    if shut:
        api.client.app.dependency_overrides[get_service] = get_service
    before, routed = api.registry.audit.count(), len(solved)
    answers = []
    for roles in requests:
        headers = [("Authorization", f"Bearer {api.tokens[role]}") for role in roles]
        resp = api.client.post("/v1/detect", headers=headers, json={"text": "w1 w2 w3", "source": "d"})
        body = resp.json()
        if "audit_seq" in body:  # the two apps share a database: the row's place after `before`
            body["audit_seq"] -= before
        if body.get("code") == "rate_limited":  # "retry in 999.9 s": the time since the last request
            body["message"] = re.sub(r"\d+\.\d s$", "(wait) s", body["message"])
        headers = sorted(resp.headers.items())
        assert ("content-length", str(len(resp.content))) in headers  # its digits may differ
        answers.append((resp.status_code, body, [h for h in headers if h[0] != "content-length"]))
    # which door answered: the route's handler ran only when shut; a request refused at
    # admission is refused before FastAPI's handler by either door (`deps.AdmittedRoute`)
    admitted = any(status not in (401, 403, 429) for status, _, _ in answers)
    assert (len(solved) > routed) == (shut and admitted)
    written = api.registry.audit.count() - before
    roles_by_id = {token.split("_")[1]: role for role, token in api.tokens.items()}
    audited = [
        (re.sub(r"(?<=token:)[0-9a-f]{12}", lambda m: roles_by_id[m.group(0)], r.actor), r.action, r.result)
        for r in (api.registry.audit.tail(written) if written else [])
    ]
    counted = [
        line
        for line in api.call("GET", "/metrics", role="auditor").text.splitlines()
        if line.startswith("wmark_auth_failures_total")
        or (line.startswith("wmark_http_requests_total") and 'route="/v1/detect"' in line)
    ]
    return answers, audited, counted
