"""/v1/detect with the prompt's token IDs (prefix-mode keys), and vLLM keys registered by an admin.

`prompt_ids` is what `wmark detect --generation` reads from a `wmark generate --json` record: the
prompt in front of the answer, scored from the answer on. Prefix-mode keys cannot be detected
without it; window keys score the answer's first tokens with it; vLLM keys ignore it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import jsonschema_rs  # schemathesis's validator
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from wmark import KeyMaterial
from wmark.api import Settings, create_app
from wmark.api.schemas import DetectItem
from wmark.detector import Detector
from wmark.keys import KeyRegistry
from wmark.keys.tokens import ROLES
from wmark.prf import KeyedSource, seed_uniforms
from wmark.race import race_winner
from wmark.vllm_gumbel import GUESSABLE_WARNING

VLLM_KEY = 0x0123456789ABCDEF  # the secret of the vLLM deployment: never in any response


@dataclass
class Api:
    client: TestClient
    registry: KeyRegistry
    tokenizer_sha256: str
    tokens: dict[str, str]

    def call(self, method: str, path: str, role: str = "admin", **kwargs):
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return self.client.request(method, path, headers=headers, **kwargs)


@pytest.fixture()
def api(registry_config, word_tokenizer_json) -> Iterator[Api]:
    settings = Settings(registry=registry_config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    with TestClient(create_app(settings)) as client:
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        ref = registry.add_tokenizer(word_tokenizer_json, "words")
        tokens = {role: registry.tokens.create(role, f"{role}-t", actor="test").token for role in ROLES}
        yield Api(client, registry, ref.sha256, tokens)


def plant_prefix(key: KeyMaterial, prompt: list[int], n: int, rng: np.random.Generator) -> list[int]:
    """An answer drawn by the keyed race under prefix labels (every token before, prompt included)."""
    keyed = KeyedSource(key.secret, key.spec)
    ids = list(prompt)
    while len(ids) < len(prompt) + n:
        cand = rng.choice(np.arange(1, key.spec.tokenizer.vocab_size), size=40, replace=False)
        probs = rng.dirichlet(np.full(40, 0.5))
        ids.append(int(cand[race_winner(probs, seed_uniforms(keyed.seed(ids), cand))]))
    return ids[len(prompt) :]


def _create(api: Api, **body) -> str:
    resp = api.call("POST", "/v1/keys", json={"name": "k", "tokenizer_sha256": api.tokenizer_sha256, **body})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["key_id"])


def test_a_prefix_mode_key_is_detected_with_the_prompt_ids(api):
    key_id = _create(api, context_mode="prefix")
    assert api.registry.get(key_id).spec.context_mode == "prefix"
    rng = np.random.default_rng(3)
    prompt = [int(x) for x in rng.integers(1, 500, size=12)]
    answer = plant_prefix(api.registry.material(key_id), prompt, 120, rng)
    body = {"token_ids": answer, "prompt_ids": prompt, "key_ids": [key_id]}
    resp = api.call("POST", "/v1/detect", role="detector", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert got["verdict"] == "watermarked" and got["n_scored"] == len(answer), got
    assert got["p_value"] < 1e-8
    direct = Detector([api.registry.material(key_id)]).detect(token_ids=prompt + answer, start=len(prompt))
    assert got["p_value"] == direct.p_value
    # Without its prompt a prefix key's labels are other labels: the evidence is gone (the
    # p-value is uniform then; below 1e-4 one time in 10,000).
    alone = api.call("POST", "/v1/detect", role="detector", json={"token_ids": answer, "key_ids": [key_id]})
    assert alone.status_code == 200 and alone.json()["p_value"] > 1e-4, alone.text
    # The batch takes it per item; the audit row says a prompt came with the IDs.
    batch = api.call(
        "POST",
        "/v1/detect/batch",
        role="detector",
        json={"items": [{"token_ids": answer, "prompt_ids": prompt}], "key_ids": [key_id]},
    )
    assert batch.status_code == 200 and batch.json()["results"][0]["p_value"] == direct.p_value, batch.text
    assert api.registry.audit.page(limit=1, action="detect")[0].result["input"] == "prompt_and_token_ids"


def test_a_window_key_scores_the_answers_first_tokens_with_the_prompt_and_vllm_keys_ignore_it(api):
    window_id = _create(api, context_width=4)
    rng = np.random.default_rng(4)
    prompt = [int(x) for x in rng.integers(1, 500, size=8)]
    answer = [int(x) for x in rng.integers(1, 500, size=60)]
    with_prompt = api.call(
        "POST",
        "/v1/detect",
        role="detector",
        json={"token_ids": answer, "prompt_ids": prompt, "key_ids": [window_id]},
    ).json()
    without = api.call(
        "POST", "/v1/detect", role="detector", json={"token_ids": answer, "key_ids": [window_id]}
    ).json()
    assert (
        with_prompt["n_scored"] == without["n_scored"] + 4
    )  # the first h positions' windows reach into the prompt
    vllm = api.call(
        "POST",
        "/v1/vllm-keys",
        json={
            "name": "prod",
            "tokenizer_sha256": api.tokenizer_sha256,
            "watermark_config": {"key": str(VLLM_KEY)},  # above 2^53 - 1: as a string
        },
    ).json()
    a = api.call(
        "POST",
        "/v1/detect",
        role="detector",
        json={"token_ids": answer, "prompt_ids": prompt, "key_ids": [vllm["key_id"]]},
    ).json()
    b = api.call(
        "POST", "/v1/detect", role="detector", json={"token_ids": answer, "key_ids": [vllm["key_id"]]}
    ).json()
    assert (a["p_value"], a["n_scored"]) == (b["p_value"], b["n_scored"])


@pytest.mark.parametrize(
    "body",
    [
        {"text": "w1 w2 w3", "prompt_ids": [1, 2]},  # a text's IDs depend on each key's tokenizer
        {"token_ids": [1, 2], "prompt_ids": []},
        {"token_ids": [1, 2], "prompt_ids": None},
        {"token_ids": [1, 2], "prompt_ids": [-1]},
        {"text": "w1", "token_ids": [1], "prompt_ids": [2]},
    ],
)
def test_bad_prompt_ids_are_a_422(api, body):
    resp = api.call("POST", "/v1/detect", role="detector", json=body)
    assert resp.status_code == 422 and resp.json()["code"] == "validation_error", resp.text


def test_the_schemas_oneof_admits_exactly_what_the_model_admits():
    """Clients (and schemathesis) read the oneOf: text alone, or token_ids with or without prompt_ids."""
    schema = jsonschema_rs.validator_for(DetectItem.model_json_schema())
    values = {"text": "w1", "token_ids": [1], "prompt_ids": [2]}
    for present in itertools.product([False, True], repeat=3):
        body = {k: v for (k, v), keep in zip(values.items(), present, strict=True) if keep}
        try:
            DetectItem.model_validate(body)
            admitted = True
        except ValidationError:
            admitted = False
        assert schema.is_valid(body) == admitted, body


def test_an_admin_registers_a_vllm_key_audited_and_the_secret_never_comes_back(api, planted):
    config = {"key": str(VLLM_KEY), "algorithm": "dual_key_gumbel", "alpha": 0.3}
    body = {"name": "prod-vllm", "tokenizer_sha256": api.tokenizer_sha256, "watermark_config": config}
    for role in ("detector", "auditor", "generator"):
        assert api.call("POST", "/v1/vllm-keys", role=role, json=body).status_code == 403
    resp = api.call("POST", "/v1/vllm-keys", json=body)
    assert resp.status_code == 201, resp.text
    info = resp.json()
    assert info["spec"]["scheme"] == "vllm-dual-key-gumbel" and info["spec"]["dual_key_alpha"] == 0.3
    shown = api.call("GET", f"/v1/keys/{info['key_id']}").text + api.call("GET", "/v1/keys").text
    audit = api.call("GET", "/v1/audit").text
    for secret in (str(VLLM_KEY), hex(VLLM_KEY)[2:]):
        assert secret not in resp.text + shown + audit
    assert api.registry.audit.page(limit=1)[0].action == "key_create"
    # what it registered detects what vLLM's sampler writes with that key
    ids = planted(api.registry.material(info["key_id"]), 200, np.random.default_rng(8))
    got = api.call("POST", "/v1/detect", role="detector", json={"token_ids": ids}).json()
    assert got["verdict"] == "watermarked" and got["key_id"] == info["key_id"]


@pytest.mark.parametrize(
    ("config", "status"),
    [
        ({}, 422),  # no secret key
        ({"key": -1}, 422),
        ({"key": 2**64}, 422),
        ({"key": True}, 422),
        ({"key": 1, "algorithm": "kgw"}, 422),
        ({"key": 1, "algorithm": ["gumbel"]}, 422),
        ({"key": 1, "alpha": 1.5}, 422),
        ({"key": 1, "context_width": 0}, 422),
        ({"key": 1, "prf": "hmac"}, 422),
        ({"key": 1, "unknown": 1}, 422),
        ({"key": 1.0, "alpha": 1}, 201),  # integral JSON numbers, as everywhere in the API
        ({"key": 2**53 - 1}, 201),
        ({"key": 2**53}, 422),  # a JSON number this large may have been rounded on its way: refused
        ({"key": VLLM_KEY}, 422),
        ({"key": "18446744073709551615"}, 201),  # any key, as its decimal digits
        ({"key": "18446744073709551616"}, 422),
        ({"key": "01"}, 422),
        ({"key": "0x10"}, 422),
        ({"key": ""}, 422),
        ({"key": " 1"}, 422),
    ],
)
def test_a_vllm_config_is_checked_and_a_bad_one_is_not_echoed(api, config, status):
    body = {"name": "v", "tokenizer_sha256": api.tokenizer_sha256, "watermark_config": config}
    resp = api.call("POST", "/v1/vllm-keys", json=body)
    assert resp.status_code == status, resp.text
    assert str(VLLM_KEY) not in resp.text and "18446744073709551616" not in resp.text


def test_the_schema_of_a_vllm_key_admits_exactly_what_the_model_admits():
    """Schemathesis (and clients) read the key's anyOf: JSON integers up to 2^53 - 1, whose bound
    a double holds exactly, or decimal strings up to 2^64 - 1."""
    from wmark.api.schemas import VllmConfigIn

    schema = jsonschema_rs.validator_for(VllmConfigIn.model_json_schema())
    values = [0, 1, 2**53 - 1, 2**53, 2**64 - 1, 2**64, -1, 4.0, 4.5, True, None, "0", "7", "00", "-1"]
    values += [str(2**64 - 1), str(2**64), str(2**64 - 1) + "0", "18446744073709551999", "1e3", "٣"]
    for key in values:
        try:
            VllmConfigIn.model_validate({"key": key})
            admitted = True
        except ValidationError:
            admitted = False
        assert schema.is_valid({"key": key}) == admitted, key


def test_a_vllm_key_needs_a_stored_tokenizer(api):
    body = {"name": "v", "tokenizer_sha256": "0" * 64, "watermark_config": {"key": 1}}
    resp = api.call("POST", "/v1/vllm-keys", json=body)
    assert resp.status_code == 404 and resp.json()["code"] == "tokenizer_not_found", resp.text


@pytest.mark.parametrize(
    ("key", "warned"), [(31337, True), (2**48 - 1, True), (str(2**48), False), (str(VLLM_KEY), False)]
)
def test_a_guessable_vllm_key_is_registered_with_a_warning(api, key, warned):
    # a chosen key is found by trying values against a watermarked text or its public
    # fingerprint (31337 in 0.05 s): registered (vLLM serves with it), but the admin is told
    body = {"name": "v", "tokenizer_sha256": api.tokenizer_sha256, "watermark_config": {"key": key}}
    resp = api.call("POST", "/v1/vllm-keys", json=body)
    assert resp.status_code == 201, resp.text
    assert ("warnings" in resp.json()) == warned
    if warned:
        assert resp.json()["warnings"] == [GUESSABLE_WARNING] and str(key) not in resp.text
    assert "rotated_at" in resp.json()  # the public view's nulls stay
