"""Hostile requests found by a review of the service, each pinned: admission before the body is
read, work bounded before validation, revocation on every answer, no token in the audit log, and
no forged audit row served or verified."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from wmark.api import Settings, create_app
from wmark.keys import KeyRegistry


@dataclass
class Api:
    client: TestClient
    registry: KeyRegistry
    tokens: dict[str, str]

    def post(self, path: str, role: str | None, **kwargs):
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        return self.client.post(path, headers=headers | kwargs.pop("headers", {}), **kwargs)


@pytest.fixture()
def api(registry_config, word_tokenizer_json) -> Iterator[Api]:
    settings = Settings(
        registry=registry_config,
        migrate=True,
        rate_per_second=1000.0,
        rate_burst=1000,
        auth_fail_per_second=1000.0,
        auth_fail_burst=1000,
    )
    with TestClient(create_app(settings)) as client:
        reg = client.app.state.service.registry
        reg.create_key("k", reg.add_tokenizer(word_tokenizer_json, "words"))
        tokens = {role: reg.tokens.create(role, role, actor="test").token for role in ("detector", "admin")}
        yield Api(client, reg, tokens)


@pytest.fixture()
def decoded(monkeypatch) -> list[int]:
    """One item per request body the app decoded as JSON (FastAPI's route handler)."""
    calls: list[int] = []
    decode = Request.json

    async def counting(self):
        if not hasattr(self, "_json"):  # Starlette keeps what it decoded
            calls.append(1)
        return await decode(self)

    monkeypatch.setattr(Request, "json", counting)
    return calls


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/detect", b'{"text": "w1'),  # truncated
        ("/v1/detect/batch", b'{"items": [' * 5000),  # deep and unfinished
        ("/v1/keys", b"[1, 2,"),
        ("/v1/vllm-keys", b'{"name": "x", "watermark_config": {"key": 1}}'),  # valid, unread
        ("/v1/detect", b'{"token_ids": [' + b",".join([b"[]"] * 100_000) + b"]}"),
    ],
)
def test_a_request_without_a_token_is_refused_before_its_body_is_read(api, decoded, path, body):
    # FastAPI decodes a body before it resolves dependencies; admission now comes first, so an
    # anonymous client learns nothing of its body and costs no decoding (a 1 MiB body of small
    # values took ~0.3 s of the event loop), and its refusal is audited like any other
    resp = api.post(path, None, content=body, headers=JSON)
    assert resp.status_code == 401 and resp.json()["code"] == "unauthorized", resp.text
    assert decoded == []
    [row] = api.registry.audit.page(limit=1, action="auth_failed")
    assert row.result["reason"] == "missing" and row.result["path"] == path


def test_a_token_holder_with_a_malformed_body_is_told_so(api):
    resp = api.post("/v1/detect", "detector", content=b'{"text": "w1', headers=JSON)
    assert resp.status_code == 422 and "JSON decode error" in resp.json()["message"]


def test_an_oversized_batch_is_refused_before_validation(api, decoded):
    # ~350,000 empty items fit in a 1 MiB body; validating them made one error each (~1 GB, seconds):
    # the item count is checked on the decoded body first, so the answer is the limit's 413 (it
    # was a 422 listing validation errors, which came first)
    body = b'{"items": [' + b",".join([b"{}"] * 300_000) + b"]}"
    resp = api.post("/v1/detect/batch", "detector", content=body, headers=JSON)
    assert resp.status_code == 413 and resp.json()["message"] == "a batch may hold at most 64 items"
    assert decoded == [1]  # FastAPI's decoding, which the size check reads again
    resp = api.post("/v1/detect/batch", "detector", json={"items": [{"token_ids": [1] * 55_000}] * 4})
    assert resp.status_code == 413 and "the limit per request is 200000" in resp.json()["message"]


@pytest.mark.parametrize("path", ["/v1/detect", "/v1/detect/batch"])
def test_a_list_of_bad_values_makes_one_validation_error(api, path):
    item = {"token_ids": ["a"] * 50_000}  # within the size limits: validation stops at the first
    body = item if path == "/v1/detect" else {"items": [item, item]}
    resp = api.post(path, "detector", json=body)
    assert resp.status_code == 422
    message = resp.json()["message"]  # the first errors, each named by where it is
    assert message.count("valid integer") == 1 and "items.1" not in message, message


def test_the_fast_door_bounds_a_body_before_validating_it(api, decoded):
    # a door request with a token: sizes are checked on the body the door decoded, then the route
    # answers the oversized one (its 413, after admission), having decoded it once itself
    resp = api.post("/v1/detect", "detector", json={"token_ids": [1] * 100_001})
    assert resp.status_code == 413 and "the limit is 100000" in resp.json()["message"]
    assert decoded == [1]


@pytest.mark.parametrize(
    "body",
    [
        {"text": "w1 w2", "key_ids": ["nosuchkey"]},  # 404
        {"text": "w1 w2", "key_ids": ["k" * 40]},  # 422 from the schema
        {"token_ids": [1] * 100_001},  # 413
    ],
)
def test_a_revoked_cached_token_is_refused_whatever_its_request(api, body):
    # cached tokens are re-checked in the audit transaction of a detection; an answer that writes
    # no audit row (an error) now checks the revocation in the database first
    token_id = api.tokens["detector"].split("_")[1]
    assert api.post("/v1/detect", "detector", json={"text": "w1 w2"}).status_code == 200  # cached now
    api.registry.tokens.revoke(token_id, actor="test")
    resp = api.post("/v1/detect", "detector", json=body)
    assert resp.status_code == 401 and resp.headers["www-authenticate"].startswith("Bearer"), resp.text
    assert api.registry.audit.page(limit=1, action="auth_failed")[0].result["reason"] == "revoked"


def test_a_token_in_the_path_is_masked_in_the_audit_log_and_the_service_log(api, caplog):
    token = api.tokens["admin"]
    with caplog.at_level(logging.INFO, logger="wmark.api"):
        assert api.client.get(f"/v1/keys/{token}").status_code == 401
    [row] = api.registry.audit.page(limit=1, action="auth_failed")
    assert row.result["path"] == "/v1/keys/wmt_***"  # auditors read this row
    secret = token.split("_", 2)[2]
    assert "rejected GET /v1/keys/wmt_***" in caplog.text and secret not in caplog.text


@pytest.mark.parametrize(("declared", "status"), [("0" * 5000 + "2", 401), ("0" * 5000 + "9" * 30, 413)])
def test_a_zero_padded_content_length_is_read_as_its_number(api, declared, status):
    # int() refuses more than 4,300 digits: the zeros are stripped first, so this is no 500
    resp = api.client.post("/v1/detect", content=b"{}", headers=JSON | {"Content-Length": declared})
    assert resp.status_code == status, resp.text
