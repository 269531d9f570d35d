"""/v1/detect with a vLLM deployment's key: the same answers as `Detector`, per-token evidence."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from wmark.api import Settings, create_app
from wmark.detector import Detector
from wmark.vllm_gumbel import VllmWatermarkConfig


def test_detect_endpoint_finds_a_vllm_watermark(registry_config, word_tokenizer_json, planted):
    settings = Settings(registry=registry_config, migrate=True, rate_per_second=1000.0, rate_burst=1000)
    with TestClient(create_app(settings)) as client:
        registry = client.app.state.service.registry  # type: ignore[attr-defined]
        ref = registry.add_tokenizer(word_tokenizer_json, "words")
        registry.create_key("own", ref)
        config = VllmWatermarkConfig(key=987654321, algorithm="dual_key_gumbel", alpha=0.3)
        info = registry.import_vllm_key("prod-vllm", ref, config)
        token = registry.tokens.create("detector", "t", actor="test").token
        ids = planted(registry.material(info.key_id), 200, np.random.default_rng(5))
        text = " ".join(f"w{i - 1}" for i in ids)
        resp = client.post(
            "/v1/detect",
            json={"text": text, "return_tokens": True},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["verdict"] == "watermarked" and body["key_id"] == info.key_id
        direct = Detector(registry.detection_keys(), {ref.sha256: word_tokenizer_json}).detect(text)
        assert body["p_value"] == direct.p_value and body["n_scored"] == direct.n_scored
        scored = [t for t in body["tokens"] if t["score"] is not None]
        assert len(scored) == body["n_scored"] and all(0.0 < t["pivot"] < 1.0 for t in scored)
        assert abs(sum(t["score"] for t in scored) - body["score"]) < 1e-9 * body["score"]
