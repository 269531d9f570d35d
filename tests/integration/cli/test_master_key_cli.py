"""The CLI under a wrong master key: writes refused (one line, exit 2), detection goes on with the
keys that open, `wmark keys master-key` exists and prints a usable key."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, MasterKey, RegistryConfig
from wmark.keys.models import Key, utcnow

runner = CliRunner()
GOOD = base64.b64encode(hashlib.sha256(b"good").digest()).decode()
OTHER = base64.b64encode(hashlib.sha256(b"other").digest()).decode()


@pytest.fixture()
def tokenizer_file(tmp_path: Path, word_tokenizer_json: bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    return path


def _run(master: str, *args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input, env={"WMARK_MASTER_KEY": master})


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    return result.stderr


def _marked_text(key_id: str, planted) -> str:
    with KeyRegistry.open(_config(GOOD)) as registry:
        key = registry.material(key_id)
    return " ".join(f"w{i - 1}" for i in planted(key, 200, np.random.default_rng(3)))


def _config(master: str) -> RegistryConfig:
    base = RegistryConfig.from_env()
    return RegistryConfig(home=base.home, database_url=base.database_url, master_key=master)


def test_a_wrong_master_key_writes_nothing_and_detection_still_works(tokenizer_file, planted):
    created = _run(GOOD, "keys", "create", "k", "--tokenizer", str(tokenizer_file))
    assert created.exit_code == 0, created.output
    key_id = created.stdout.strip()
    for args in (("keys", "rotate", key_id), ("keys", "create", "k2", "--tokenizer", str(tokenizer_file))):
        message = _one_line_error(_run(OTHER, *args))
        assert "is not this registry's" in message and "nothing was written" in message
        assert OTHER not in message and GOOD not in message
    listed = _run(GOOD, "keys", "list", "--json")
    assert listed.stdout.count('"key_id"') == 1 and '"status": "active"' in listed.stdout
    detected = _run(GOOD, "detect", "--json", input=_marked_text(key_id, planted))
    assert detected.exit_code == 0, detected.output
    assert '"verdict": "watermarked"' in detected.stdout


def test_detect_leaves_out_a_key_sealed_under_another_master_key(tokenizer_file, planted):
    key_id = _run(GOOD, "keys", "create", "k", "--tokenizer", str(tokenizer_file)).stdout.strip()
    foreign = MasterKey.load(_config(OTHER))
    with KeyRegistry.open(_config(GOOD)) as registry, registry.sessions.begin() as session:
        model = session.get(Key, key_id)
        session.add(  # what a rotation under a wrong master key left before the check existed
            Key(
                id="wk_f0f0f0f0f0f0",
                name="k",
                status="active",
                spec=model.spec,
                fingerprint="0" * 16,
                tokenizer_sha256=model.tokenizer_sha256,
                secret_ciphertext=foreign.seal(b"s" * 32, b"wk_f0f0f0f0f0f0"),
                master_key_id=foreign.key_id,
                created_at=utcnow(),
            )
        )
    text = _marked_text(key_id, planted)
    for args in (("detect", "--json"), ("detect", "--json", "--key", key_id)):
        result = _run(GOOD, *args, input=text)
        assert result.exit_code == 0, result.output
        assert '"verdict": "watermarked"' in result.stdout
    everything = _run(GOOD, "detect", "--json", input=text)
    assert "warning: key wk_f0f0f0f0f0f0 left out" in everything.stderr
    assert "sealed under master key" in everything.stderr
    only_foreign = _run(GOOD, "detect", "--key", "wk_f0f0f0f0f0f0", input=text)
    assert "key wk_f0f0f0f0f0f0 was sealed under master key" in _one_line_error(only_foreign)


def test_the_command_the_placeholder_error_names_exists_and_prints_a_key():
    refused = _one_line_error(_run("changeme", "keys", "list"))
    command = re.search(r"`wmark ([^`]+)`", refused)
    assert command is not None, refused
    printed = runner.invoke(app, command.group(1).split(), env={"WMARK_MASTER_KEY": "changeme"})
    assert printed.exit_code == 0, printed.output
    value = printed.stdout.strip()
    assert MasterKey.load(_config(value)).key_id  # a valid, strong key
    assert runner.invoke(app, command.group(1).split()).stdout.strip() != value  # fresh each time
