"""`wmark scan --receipts`: every row with a verdict carries a signed receipt (the format of
`wmark detect --receipt`) that `wmark receipt verify` checks offline against the document's
text; a changed byte of the receipt or of the text fails; JSONL, CSV and Parquet alike; the
receipts name the audit row of their scan's run; a scan without receipts keeps its columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.jwk import read_jwks
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.receipts import verify_receipt
from wmark.scan.rows import COLUMNS, RECEIPT_COLUMNS

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture()
def store(tmp_path: Path, word_tokenizer_json: bytes, planted) -> dict[str, object]:
    """A folder: a watermarked text, a human one, a JSONL of human posts with one watermarked
    and one blank (an error row); and the key's id."""
    (tmp_path / "tokenizer.json").write_bytes(word_tokenizer_json)
    key_id = _invoke("keys", "create", "k", "--tokenizer", str(tmp_path / "tokenizer.json")).stdout.strip()
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(key_id)
    rng = np.random.default_rng(7)

    def marked() -> str:
        return " ".join(f"w{i - 1}" for i in planted(key, 150, rng))

    def human() -> str:
        return " ".join(f"w{i}" for i in rng.integers(0, 500, size=150))

    root = tmp_path / "docs"
    root.mkdir()
    (root / "marked.txt").write_text(marked() + "\n", encoding="utf-8")
    (root / "human.txt").write_text(human(), encoding="utf-8")
    posts = [{"body": human()} for _ in range(6)]
    posts[2] = {"body": marked()}
    posts[4] = {"body": "   "}
    (root / "posts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in posts), encoding="utf-8")
    return {"root": root, "key_id": key_id, "posts": posts}


def _jwks(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(_invoke("receipt", "keys", "--json").stdout)
    return path


def _scan(store, out: Path, *extra: str) -> None:
    result = _invoke(
        "scan", str(store["root"]), "--field", "body", "--out", str(out), "--workers", "0", *extra
    )  # fmt: skip
    assert result.exit_code == 0, result.output


def _rows(out: Path) -> list[dict[str, object]]:
    if out.suffix == ".csv":
        with open(out, encoding="utf-8", newline="") as fh:
            return [{k: (v or None) for k, v in r.items()} for r in csv.DictReader(fh)]
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(out).to_pylist()
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_a_scan_rows_receipt_verifies_offline_and_a_flipped_byte_fails(store, tmp_path):
    out = tmp_path / "out.jsonl"
    _scan(store, out, "--receipts")
    rows = {(Path(str(r["source"])).name, r["doc_id"]): r for r in _rows(out)}
    assert len(rows) == 8 and all(list(r) == list(RECEIPT_COLUMNS) for r in rows.values())
    assert rows[("posts.jsonl", "line:5")]["verdict"] == "error"
    assert rows[("posts.jsonl", "line:5")]["receipt"] is None  # no verdict, nothing to sign
    assert all(isinstance(r["receipt"], str) for r in rows.values() if r["verdict"] != "error")

    row = rows[("marked.txt", "")]
    assert row["verdict"] == "watermarked"
    receipt = tmp_path / "marked.receipt"
    receipt.write_text(str(row["receipt"]) + "\n", encoding="utf-8")  # as `jq -r .receipt` writes it
    jwks, text = _jwks(tmp_path), store["root"] / "marked.txt"
    result = _invoke("receipt", "verify", str(receipt), "-k", str(jwks), "--text", str(text), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)["payload"]
    detection = payload["detection"]
    assert detection["method"] == "scan" and detection["verdict"] == "watermarked"
    assert detection["log_p"] == repr(row["log_p"]) and detection["n_scored"] == row["n_scored"]
    assert detection["source"] == row["source"] and detection["doc_id"] == ""
    assert payload["key"]["id"] == store["key_id"]

    # The receipts name the audit row written when this run of the scan started.
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        [start] = registry.audit.page(limit=10, action="scan_start")
        [end] = registry.audit.page(limit=10, action="scan")
    assert payload["audit_seq"] == start.seq < end.seq
    assert start.result["receipt_kid"] == payload["kid"] and start.key_ids == (store["key_id"],)

    data = receipt.read_bytes()
    for at in (10, len(data) // 2, len(data) - 5):  # a byte of the payload, of the signature
        flipped = tmp_path / f"flipped{at}.receipt"
        flipped.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
        result = _invoke("receipt", "verify", str(flipped), "-k", str(jwks), "--text", str(text))
        assert result.exit_code == 1 and "INVALID" in result.stdout, (at, result.output)
    changed = tmp_path / "changed.txt"
    changed.write_bytes(text.read_bytes().replace(b"w", b"W", 1))
    result = _invoke("receipt", "verify", str(receipt), "-k", str(jwks), "--text", str(changed))
    assert result.exit_code == 1 and "does not match" in result.stdout

    # A JSONL record's receipt is about its field's text.
    post = rows[("posts.jsonl", "line:3")]
    assert post["verdict"] == "watermarked"
    body = str(store["posts"][2]["body"]).encode("utf-8")  # type: ignore[index]
    keys = read_jwks(jwks.read_bytes())
    assert verify_receipt(str(post["receipt"]), keys, text=body).ok
    assert not verify_receipt(str(post["receipt"]), keys, text=body + b" ").ok
    human = rows[("human.txt", "")]
    assert verify_receipt(str(human["receipt"]), keys, text=(store["root"] / "human.txt").read_bytes()).ok


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_rows_carry_receipts_that_verify(store, tmp_path, suffix):
    out = tmp_path / f"out{suffix}"
    _scan(store, out, "--receipts")
    rows = _rows(out)
    assert list(rows[0]) == list(RECEIPT_COLUMNS)
    keys = read_jwks(_jwks(tmp_path).read_bytes())
    signed = [r for r in rows if r["verdict"] != "error"]
    assert len(signed) == 7 and all(verify_receipt(str(r["receipt"]), keys).ok for r in signed)
    text = (store["root"] / "marked.txt").read_bytes()
    [marked] = [r for r in rows if str(r["source"]).endswith("marked.txt")]
    assert verify_receipt(str(marked["receipt"]), keys, text=text).ok


def test_without_receipts_the_columns_stay_and_a_resume_must_keep_the_choice(store, tmp_path):
    out = tmp_path / "out.jsonl"
    _scan(store, out)
    assert all(list(r) == list(COLUMNS) for r in _rows(out))
    assert not _invoke("audit", "tail", "--json", "--action", "scan_start").stdout.strip()
    result = runner.invoke(
        app, ["scan", str(store["root"]), "--field", "body", "--out", str(out), "--resume", "--receipts"]
    )
    assert result.exit_code == 2 and "receipts" in result.output


def test_a_resumed_scan_signs_its_new_rows_under_its_own_audit_row(store, tmp_path):
    out = tmp_path / "out.jsonl"
    _scan(store, out, "--receipts")
    first = _rows(out)
    # Drop the last committed rows as a crash would have left them (manifest rewritten to match).
    manifest_path = out.with_name(out.name + ".manifest.json")
    manifest = json.loads(manifest_path.read_text())
    kept = out.read_bytes().splitlines(keepends=True)[:3]
    out.write_bytes(b"".join(kept))
    manifest.update(complete=False, summary=None, committed_rows=3, committed_bytes=len(b"".join(kept)))
    manifest_path.write_text(json.dumps(manifest))
    _scan(store, out, "--receipts", "--resume")
    rows = _rows(out)
    assert [r["doc_id"] for r in rows] == [r["doc_id"] for r in first]
    keys = read_jwks(_jwks(tmp_path).read_bytes())
    seqs = [verify_receipt(str(r["receipt"]), keys).payload["audit_seq"] for r in rows if r["receipt"]]
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        starts = sorted(r.seq for r in registry.audit.page(limit=10, action="scan_start"))
    assert len(starts) == 2 and set(seqs) == set(starts)
    assert _invoke("audit", "verify").exit_code == 0


def test_a_scan_prepared_with_receipts_runs_only_with_a_signer(store, tmp_path):
    from wmark.scan.scan import prepare_scan

    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(str(store["key_id"]))
        tokenizers = {key.spec.tokenizer.sha256: registry.tokenizer_json(key.spec.tokenizer.sha256)}
    out = tmp_path / "api.jsonl"
    common = {
        "urls": [str(store["root"] / "human.txt")],
        "keys": [key],
        "tokenizers": tokenizers,
        "workers": 0,
    }
    with prepare_scan(out=out, receipts=True, **common) as job:
        assert job.receipts
        with pytest.raises(ValueError, match="receipts"):
            job.run()
    with prepare_scan(out=out, overwrite=True, **common) as job:
        assert not job.receipts
        job.run()
    assert list(_rows(out)[0]) == list(COLUMNS)
