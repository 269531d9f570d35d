"""The `wmark` CLI: keys and detect, JSON output, one-line errors with exit 2, no secret leaks."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig

runner = CliRunner()


@pytest.fixture()
def tokenizer_file(tmp_path: Path, word_tokenizer_json: bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    return path


def _invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def _create_key(tokenizer_file: Path, name: str = "test") -> str:
    result = _invoke("keys", "create", name, "--tokenizer", str(tokenizer_file))
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def _watermarked_text(key_id: str, planted, seed: int, n: int = 200) -> str:
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(key_id)
    ids = planted(key, n, np.random.default_rng(seed))
    return " ".join(f"w{i - 1}" for i in ids)


def test_keys_create_list_show_rotate_revoke(tokenizer_file):
    key_id = _create_key(tokenizer_file)
    listed = [json.loads(line) for line in _invoke("keys", "list", "--json").stdout.splitlines()]
    assert [k["key_id"] for k in listed] == [key_id]
    shown = json.loads(_invoke("keys", "show", key_id, "--json").stdout)
    assert shown["status"] == "active" and shown["spec"]["context_width"] == 4
    new_id = _invoke("keys", "rotate", key_id).stdout.strip()
    assert new_id != key_id and new_id.startswith("wk_")
    assert json.loads(_invoke("keys", "show", key_id, "--json").stdout)["status"] == "retired"
    assert json.loads(_invoke("keys", "revoke", new_id, "--json").stdout)["status"] == "revoked"
    assert "revoked" in _invoke("keys", "list").stdout
    created = json.loads(
        _invoke(
            "keys", "create", "wide", "--tokenizer", str(tokenizer_file), "--context-width", "6", "--json"
        ).stdout
    )
    assert created["spec"]["context_width"] == 6


def test_detect_files_stdin_and_json(tokenizer_file, tmp_path, planted):
    key_id = _create_key(tokenizer_file)
    marked = tmp_path / "marked.txt"
    marked.write_text(_watermarked_text(key_id, planted, seed=1))
    plain = tmp_path / "plain.txt"
    rng = np.random.default_rng(2)
    plain.write_text(" ".join(f"w{i}" for i in rng.integers(0, 500, size=200)))
    result = _invoke("detect", str(marked), str(plain), "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["source"] for r in rows] == [str(marked), str(plain)]
    assert rows[0]["verdict"] == "watermarked" and rows[0]["p_value"] < 1e-6 and rows[0]["key_id"] == key_id
    assert rows[1]["verdict"] == "not_detected"
    for field in ("source", "verdict", "p_value", "n_tokens", "n_scored", "key_id"):
        assert field in rows[0]
    piped = _invoke("detect", "--json", input=marked.read_text())
    assert json.loads(piped.stdout)["source"] == "stdin"
    assert "watermarked" in _invoke("detect", str(marked)).stdout
    assert _invoke("detect", str(plain), "--check").exit_code == 1
    assert _invoke("detect", str(marked), "--check").exit_code == 0


@pytest.mark.parametrize(
    "setup,args,message",
    [
        (None, ["detect", "{tmp}/missing.txt"], "no such file"),
        (None, ["detect", "{tmp}/[draft]/missing.txt"], "[draft]/missing.txt"),  # printed, not markup
        ("bad", ["detect", "{tmp}/bad.txt"], "not UTF-8"),
        ("empty", ["detect", "{tmp}/empty.txt"], "empty"),
        (None, ["detect", "/dev/null"], "/dev/null is empty"),  # a device: read, not a missing file
        ("dir", ["detect", "{tmp}/adir"], "adir is a directory: scan a folder with `wmark scan"),
        ("big", ["detect", "--max-bytes", "1000", "{tmp}/big.txt"], "over the 1,000-byte limit"),
        ("huge", ["detect", "{tmp}/huge.txt"], "over the 4,194,304-byte limit of --max-bytes"),
        ("ok", ["detect", "--key", "wk_unknown", "{tmp}/ok.txt"], "no key with id"),
        ("ok", ["detect", "--alpha", "0", "{tmp}/ok.txt"], "alpha"),
        (None, ["keys", "show", "wk_nope"], "no key with id"),
        (None, ["keys", "create", "x", "--tokenizer", "{tmp}/nope.json"], "no tokenizer"),
        ("bad", ["keys", "create", "x", "--tokenizer", "{tmp}/bad.txt"], "not a tokenizer.json"),
        ("dir", ["keys", "create", "x", "--tokenizer", "{tmp}/adir"], "no tokenizer in"),
        # a config without its vocabulary: transformers builds a 3-token tokenizer from it
        ("model dir", ["keys", "create", "x", "--tokenizer", "{tmp}/adir"], "has 3 tokens"),
        # a file transformers looks at but cannot build from: its several-line message on one line
        ("bad model dir", ["keys", "create", "x", "--tokenizer", "{tmp}/adir"], "cannot load a tokenizer"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(setup, args, message, tmp_path, tokenizer_file):
    _create_key(tokenizer_file)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "ok.txt").write_text("w1 w2 w3 w4 w5 w6")
    if setup in ("dir", "model dir", "bad model dir"):
        (tmp_path / "adir").mkdir()
    if setup == "model dir":
        (tmp_path / "adir" / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    if setup == "bad model dir":
        (tmp_path / "adir" / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    if setup == "big":
        (tmp_path / "big.txt").write_text("w1 " * 334)  # 1,002 bytes
    if setup == "huge":  # 50 MB (sparse): refused after reading 4 MiB + 1 bytes, not read whole
        with open(tmp_path / "huge.txt", "wb") as fh:
            fh.truncate(50_000_000)
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_no_secret_in_any_output_or_log(tokenizer_file, tmp_path, planted, caplog):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO)  # SQL echo, parameters included
    outputs = []
    key_id = _create_key(tokenizer_file)
    new_id = _invoke("keys", "rotate", key_id, "--json").stdout
    outputs.append(new_id)
    new_id = json.loads(new_id)["key_id"]
    text_file = tmp_path / "t.txt"
    text_file.write_text(_watermarked_text(new_id, planted, seed=3))
    for args in (
        ["keys", "list"],
        ["keys", "list", "--json"],
        ["keys", "show", key_id],
        ["keys", "show", new_id, "--json"],
        ["detect", str(text_file)],
        ["detect", str(text_file), "--json"],
        ["keys", "revoke", key_id, "--json"],
    ):
        result = runner.invoke(app, args)
        outputs += [result.stdout, result.stderr]
    config = RegistryConfig.from_env()
    with KeyRegistry.open(config) as registry:
        secrets = [registry.material(new_id).secret.reveal()]
    secrets.append(base64.b64decode(config.key_file.read_text().strip()))  # the master key itself
    haystack = "\n".join(outputs) + "\n" + caplog.text
    for raw in secrets:
        for form in (
            raw.hex(),
            base64.b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode().rstrip("="),
            repr(raw),
        ):
            assert form not in haystack


def test_help_explains_every_command():
    top = _invoke("--help").stdout
    for cmd in ("detect", "keys"):
        assert cmd in top
    assert "--alpha" in _invoke("detect", "--help").stdout
    for sub in ("create", "list", "show", "rotate", "revoke"):
        assert _invoke("keys", sub, "--help").exit_code == 0


def test_detect_bounds_stdin_and_documents_the_limit(tokenizer_file):
    _create_key(tokenizer_file)
    result = runner.invoke(app, ["detect", "--max-bytes", "1000"], input="w1 " * 334)
    assert result.exit_code == 2 and "stdin is over the 1,000-byte limit" in result.stderr
    assert _invoke("detect", "--max-bytes", "1002", input="w1 " * 334).exit_code == 0  # at the limit
    assert "--max-bytes" in _invoke("detect", "--help").stdout
