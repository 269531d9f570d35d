"""`wmark detect --receipt` and `wmark receipt`: keys, rotate, revoke, and verify offline, in a
process that has no registry (no WMARK_* variables, an empty home; keys/ and api/ unimportable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture()
def signed(tmp_path: Path, word_tokenizer_json: bytes, planted) -> dict[str, Path]:
    """A watermarked text, its receipt (`wmark detect --receipt`) and the key set (`--json`)."""
    (tmp_path / "tokenizer.json").write_bytes(word_tokenizer_json)
    key_id = _invoke("keys", "create", "k", "--tokenizer", str(tmp_path / "tokenizer.json")).stdout.strip()
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        ids = planted(registry.material(key_id), 200, np.random.default_rng(1))
    text = tmp_path / "answer.txt"
    text.write_text(" ".join(f"w{i - 1}" for i in ids) + "\n")
    receipt = tmp_path / "answer.receipt"
    assert _invoke("detect", str(text), "--receipt", str(receipt)).exit_code == 0
    jwks = tmp_path / "jwks.json"
    jwks.write_text(_invoke("receipt", "keys", "--json").stdout)
    return {"text": text, "receipt": receipt, "jwks": jwks}


def test_detect_receipt_verifies_and_names_the_audit_row(signed):
    result = _invoke(
        "receipt", "verify", str(signed["receipt"]), "--public-keys", str(signed["jwks"]),
        "--text", str(signed["text"]), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        row = registry.audit.page(limit=1, action="detect")[0]
    assert report["ok"] and report["payload"]["audit_seq"] == row.seq
    assert report["payload"]["input"]["sha256"] == row.text_sha256
    assert report["payload"]["detection"]["verdict"] == "watermarked"
    assert len(signed["receipt"].read_bytes().splitlines()) == 1


def test_a_changed_text_or_receipt_is_invalid_with_exit_1(signed, tmp_path):
    other = tmp_path / "other.txt"
    other.write_bytes(signed["text"].read_bytes().replace(b"w", b"W", 1))
    result = _invoke(
        "receipt", "verify", str(signed["receipt"]), "-k", str(signed["jwks"]), "--text", str(other)
    )
    assert result.exit_code == 1 and "INVALID" in result.stdout and "does not match" in result.stdout
    edited = tmp_path / "edited.receipt"
    edited.write_bytes(
        signed["receipt"].read_bytes().replace(b'"verdict":"watermarked"', b'"verdict":"not_detected"')
    )
    result = _invoke("receipt", "verify", str(edited), "-k", str(signed["jwks"]))
    assert result.exit_code == 1 and "signature does not match" in result.stdout


def test_rotate_keeps_old_receipts_valid_and_revoke_makes_them_fail_saying_so(signed, tmp_path):
    old_kid = json.loads(signed["jwks"].read_text())["keys"][0]["kid"]
    new_kid = _invoke("receipt", "rotate").stdout.split()[0]
    assert new_kid != old_kid
    second = tmp_path / "second.receipt"
    assert _invoke("detect", str(signed["text"]), "--receipt", str(second)).exit_code == 0
    both = tmp_path / "both.receipt"
    both.write_bytes(signed["receipt"].read_bytes() + second.read_bytes())
    jwks = tmp_path / "jwks2.json"
    jwks.write_text(_invoke("receipt", "keys", "--json").stdout)
    assert _invoke("receipt", "verify", str(both), "-k", str(jwks)).exit_code == 0
    # '--': a kid is base64url and starts with '-' one time in 64 (it failed CI that way)
    assert _invoke("receipt", "revoke", "--", old_kid).stdout.strip() == f"{old_kid} revoked"
    jwks.write_text(_invoke("receipt", "keys", "--json").stdout)
    statuses = {k["kid"]: k["status"] for k in json.loads(jwks.read_text())["keys"]}
    assert statuses == {old_kid: "revoked", new_kid: "active"}
    result = _invoke("receipt", "verify", str(signed["receipt"]), "-k", str(jwks))
    assert result.exit_code == 1 and "signed by a revoked key" in result.stdout
    assert _invoke("receipt", "verify", str(second), "-k", str(jwks)).exit_code == 0
    assert "revoked" in _invoke("receipt", "keys").stdout


def test_generation_receipts_attest_the_token_ids(tmp_path, word_tokenizer_json, planted):
    (tmp_path / "tokenizer.json").write_bytes(word_tokenizer_json)
    key_id = _invoke("keys", "create", "k", "--tokenizer", str(tmp_path / "tokenizer.json")).stdout.strip()
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        ids = planted(registry.material(key_id), 120, np.random.default_rng(2))
    record = {"prompt_ids": ids[:4], "token_ids": ids[4:], "text": " ".join(f"w{i - 1}" for i in ids[4:])}
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(record))
    receipt = tmp_path / "gen.receipt"
    assert _invoke("detect", "--generation", str(gen), "--receipt", str(receipt)).exit_code == 0
    jwks = tmp_path / "jwks.json"
    jwks.write_text(_invoke("receipt", "keys", "--json").stdout)
    assert _invoke("receipt", "verify", str(receipt), "-k", str(jwks), "--token-ids", str(gen)).exit_code == 0
    answer_only = tmp_path / "answer_ids.json"
    answer_only.write_text(json.dumps(ids[4:]))
    result = _invoke("receipt", "verify", str(receipt), "-k", str(jwks), "--token-ids", str(answer_only))
    assert result.exit_code == 1 and "prompt_and_token_ids" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["receipt", "verify", "{tmp}/missing", "-k", "{jwks}"], "no such file"),
        (["receipt", "verify", "{receipt}", "-k", "{tmp}/answer.txt"], "not JSON"),
        (
            ["receipt", "verify", "{receipt}", "-k", "{jwks}", "--text", "{tmp}/x", "--token-ids", "{tmp}/x"],
            "not both",
        ),
        (["receipt", "verify", "{receipt}", "-k", "{jwks}", "--token-ids", "{tmp}/answer.txt"], "token IDs"),
        (["receipt", "revoke", "nope"], "no receipt signing key"),
        (["detect", "{tmp}/answer.txt", "--receipt", "{tmp}/no/such/dir/r"], "cannot write"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(signed, tmp_path, args, message):
    paths = {"tmp": tmp_path, "jwks": signed["jwks"], "receipt": signed["receipt"]}
    result = runner.invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def _bare_env(home: Path) -> dict[str, str]:
    """The environment of a machine with no registry: no WMARK_* variable, an empty home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMARK_", "XDG_"))}
    return {**env, "HOME": str(home)}


_OFFLINE = """
import sys
class NoRegistry:  # keys/ and api/ (and the database driver) cannot be imported at all
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("wmark.keys", "wmark.api", "sqlalchemy")):
            raise ImportError(f"{name} is not importable here")
sys.meta_path.insert(0, NoRegistry())
from wmark.jwk import read_jwks
from wmark.receipts import verify_receipt
receipt, jwks, text = (open(p, "rb").read() for p in sys.argv[1:4])
good = verify_receipt(receipt, read_jwks(jwks), text=text)
bad = verify_receipt(receipt, read_jwks(jwks), text=text + b" ")
loaded = sorted(m for m in sys.modules if m.startswith(("wmark.keys", "wmark.api", "sqlalchemy")))
print(good.ok, bad.ok, loaded)
"""


def test_a_receipt_verifies_offline_where_keys_and_api_cannot_be_imported(signed, tmp_path):
    home = tmp_path / "bare-home"
    home.mkdir()
    files = [str(signed[k]) for k in ("receipt", "jwks", "text")]
    run = subprocess.run(
        [sys.executable, "-c", _OFFLINE, *files],
        env=_bare_env(home),
        capture_output=True,
        text=True,
        cwd=home,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False", "[]"]
    assert list(home.iterdir()) == []


def test_wmark_receipt_verify_touches_no_registry(signed, tmp_path):
    home = tmp_path / "bare-home"
    home.mkdir()
    wmark = Path(sys.executable).with_name("wmark")
    args = [str(wmark), "receipt", "verify", str(signed["receipt"]), "--public-keys", str(signed["jwks"])]
    env = _bare_env(home)
    ok = subprocess.run(
        [*args, "--text", str(signed["text"])], env=env, capture_output=True, text=True, cwd=home
    )
    assert ok.returncode == 0 and ok.stdout.startswith("valid: watermarked"), ok.stdout + ok.stderr
    bad = subprocess.run(
        [*args, "--text", str(signed["jwks"])], env=env, capture_output=True, text=True, cwd=home
    )
    assert bad.returncode == 1 and "INVALID" in bad.stdout
    assert list(home.rglob("*")) == []  # no data directory, database or master key was created
