"""`wmark keys create --scheme vllm-*`: a vLLM deployment's key, detected like any other key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.errors import InputError
from wmark.keys import KeyRegistry, RegistryConfig

runner = CliRunner()
VLLM_KEY = 0x0123456789ABCDEF  # the secret: must never be printed


@pytest.fixture()
def tokenizer_file(tmp_path: Path, word_tokenizer_json: bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    return path


def _invoke(*args: str):
    return runner.invoke(app, list(args))


def _create(tokenizer_file: Path, scheme: str, config: dict[str, object], *extra: str) -> str:
    result = _invoke(
        "keys", "create", "prod-vllm", "--scheme", scheme, "--watermark-config", json.dumps(config),
        "--tokenizer", str(tokenizer_file), *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def _vllm_text(key_id: str, planted, seed: int, n: int = 200) -> str:
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(key_id)
    return " ".join(f"w{i - 1}" for i in planted(key, n, np.random.default_rng(seed)))


@pytest.mark.parametrize(
    "scheme,config",
    [
        ("vllm-gumbel", {"algorithm": "gumbel", "key": VLLM_KEY, "prf": "philox"}),
        ("vllm-dual-key-gumbel", {"key": VLLM_KEY, "alpha": 0.2, "context_width": 3}),
    ],
)
def test_vllm_key_detects_with_detect_and_scan(scheme, config, tokenizer_file, tmp_path, planted):
    wmark_key = _invoke("keys", "create", "own", "--tokenizer", str(tokenizer_file)).stdout.strip()
    key_id = _create(tokenizer_file, scheme, config)
    shown = json.loads(_invoke("keys", "show", key_id, "--json").stdout)
    assert shown["spec"]["scheme"] == scheme and shown["spec"]["prf"]["name"] == "vllm-philox4x32-10"
    assert shown["spec"]["context_width"] == config.get("context_width", 4)

    marked, plain = tmp_path / "marked.txt", tmp_path / "plain.txt"
    marked.write_text(_vllm_text(key_id, planted, seed=1))
    plain.write_text(" ".join(f"w{i}" for i in np.random.default_rng(2).integers(0, 500, size=200)))
    rows = [
        json.loads(line) for line in _invoke("detect", str(marked), str(plain), "--json").stdout.splitlines()
    ]
    assert rows[0]["verdict"] == "watermarked" and rows[0]["key_id"] == key_id and rows[0]["p_value"] < 1e-6
    assert {k["key_id"] for k in rows[0]["keys"]} == {key_id, wmark_key}  # Holm over both keys
    assert rows[1]["verdict"] == "not_detected"

    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "\n".join(json.dumps({"id": i, "text": p.read_text()}) for i, p in enumerate((marked, plain)))
    )
    out = tmp_path / "out.jsonl"
    result = _invoke("scan", str(docs), "--field", "text", "--out", str(out), "--workers", "0")
    assert result.exit_code == 0, result.output
    verdicts = sorted((r["verdict"], r.get("key_id")) for r in map(json.loads, out.read_text().splitlines()))
    assert verdicts[1] == ("watermarked", key_id) and verdicts[0][0] == "not_detected"


def test_config_from_file_and_the_secret_never_shows(tokenizer_file, tmp_path, planted):
    config = tmp_path / "wm.json"
    config.write_text(json.dumps({"algorithm": "gumbel", "key": VLLM_KEY}))
    result = _invoke("keys", "create", "f", "--scheme", "vllm-gumbel", "--watermark-config", f"@{config}",
                     "--tokenizer", str(tokenizer_file), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    key_id = json.loads(result.stdout)["key_id"]
    text = tmp_path / "t.txt"
    text.write_text(_vllm_text(key_id, planted, seed=3))
    outputs = [result.stdout]
    for args in (["keys", "show", key_id], ["keys", "list", "--json"], ["detect", str(text), "--json"]):
        run = _invoke(*args)
        outputs += [run.stdout, run.stderr]
    haystack = "\n".join(outputs)
    for form in (str(VLLM_KEY), hex(VLLM_KEY), f"{VLLM_KEY:x}"):
        assert form not in haystack
    assert "vllm-gumbel" in haystack


@pytest.mark.parametrize(
    "args,message",
    [
        (["--scheme", "vllm-gumbel"], "needs vLLM's config"),
        (["--scheme", "vllm-gumbel", "--watermark-config", "{"], "not JSON"),
        (
            ["--scheme", "vllm-gumbel", "--watermark-config", '{"algorithm": "gumbel"}'],
            "needs its secret 'key'",
        ),
        (
            ["--scheme", "vllm-gumbel", "--watermark-config", '{"key": 1, "algorithm": "dual_key_gumbel"}'],
            "not scheme",
        ),
        (["--scheme", "vllm-gumbel", "--watermark-config", '{"key": -1}'], "0..2^64 - 1"),
        (
            ["--scheme", "vllm-gumbel", "--watermark-config", '{"key": 1, "seed": 3}'],
            "unknown watermark config",
        ),
        (["--scheme", "kgw", "--watermark-config", '{"key": 1}'], "one of wmark"),
        (["--watermark-config", '{"key": 1}'], "only with --scheme"),
        (["--scheme", "vllm-gumbel", "--watermark-config", "@/nonexistent/wm.json"], "cannot read"),
    ],
)
def test_bad_vllm_configs_give_one_line_and_exit_2(args, message, tokenizer_file):
    result = _invoke("keys", "create", "x", "--tokenizer", str(tokenizer_file), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_vllm_keys_are_not_rotated_nor_generated_with(tokenizer_file):
    key_id = _create(tokenizer_file, "vllm-gumbel", {"key": VLLM_KEY})
    result = _invoke("keys", "rotate", key_id)
    assert result.exit_code == 2 and "--watermark-config" in result.output
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        with pytest.raises(InputError, match="vLLM generates it"):
            registry.material(key_id, for_generation=True)
        assert registry.material(key_id).spec.scheme == "vllm-gumbel"  # detection still gets it


@pytest.mark.parametrize(("key", "warned"), [(31337, True), (VLLM_KEY, False)])
def test_a_guessable_vllm_key_is_registered_with_a_warning_on_stderr(tokenizer_file, key, warned):
    result = _invoke("keys", "create", "v", "--scheme", "vllm-gumbel", "--watermark-config",
                     json.dumps({"key": key}), "--tokenizer", str(tokenizer_file))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ("warning: this vLLM key is below 2^48" in result.stderr) == warned
    assert result.stdout.strip().startswith("wk_") and str(key) not in result.output
