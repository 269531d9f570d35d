"""`wmark calibrate`: a key's false-positive rate on the user's own text, stored with the key and
shown by `wmark keys show`; a corpus that makes the detector misbehave is reported, not hidden;
`wmark detect` warns about keys never calibrated or calibrated under another spec."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from typer.testing import CliRunner

from wmark.api import Settings, create_app
from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.models import Key
from wmark.spec import WatermarkSpec

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _create_key(*extra: str) -> str:
    result = _invoke("keys", "create", "k", *extra)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


@pytest.fixture()
def tokenizer_file(tmp_path: Path, word_tokenizer_json: bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    return path


def _words(rng: np.random.Generator, n: int) -> list[str]:
    return [f"w{i}" for i in rng.integers(0, 500, size=n)]


def test_calibrate_on_the_bundled_human_corpus_is_kept_with_each_key(tmp_path):
    """The bar of the feature, on 120 of the human documents the suite calibrates on (2,000 in
    BENCHMARKS.md): a rate inside its binomial interval, the KS p-value, the smallest p, a QQ
    table per key, and the result in `wmark keys show` and `GET /v1/keys/{id}`."""
    first, second = _create_key(), _create_key()
    result = _invoke("calibrate", "--system-corpus", "120", "--json", "--qq", str(tmp_path / "qq.csv"))
    assert result.exit_code == 0, result.output
    reports = {r["key_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert set(reports) == {first, second}
    for key_id, report in reports.items():
        fpr, docs = report["fpr"], report["documents"]
        assert docs["read"] == 120 and fpr["scored"] >= 110 and docs["duplicates"] == 0
        assert fpr["within"] and fpr["flagged"] <= fpr["expected_high"]
        assert fpr["ci_low"] <= fpr["rate"] <= fpr["ci_high"]
        assert report["uniformity"]["alternative"] == "greater" and report["uniformity"]["p_value"] > 0.001
        assert 1e-6 < report["min_p"]["p_value"] <= 1.0 and report["min_p"]["source"]
        assert sum(b["scored"] for b in report["length_buckets"]) == fpr["scored"]
        rows = list(csv.DictReader((tmp_path / f"qq-{key_id}.csv").read_text().splitlines()))
        assert len(rows) == fpr["scored"]
        assert [float(r["observed"]) for r in rows] == sorted(float(r["observed"]) for r in rows)
        shown = json.loads(_invoke("keys", "show", key_id, "--json").stdout)["calibration"]
        assert shown["corpus_sha256"] == report["corpus_sha256"] and shown["created_at"].startswith("20")
        assert (shown["n_scored"], shown["n_flagged"], shown["stale"]) == (
            fpr["scored"],
            fpr["flagged"],
            False,
        )
        assert shown["report"] == report
        text = _invoke("keys", "show", key_id).stdout
        assert "calibrated" in text and report["corpus_sha256"][:12] in text
    assert len({r["corpus_sha256"] for r in reports.values()}) == 1  # one corpus
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        audited = registry.audit.page(action="key_calibrate")
        admin = registry.tokens.create("admin", "t", actor="test").token
    assert sorted(a.key_ids[0] for a in audited) == sorted(reports)
    # and the service shows the same calibration: GET /v1/keys/{id}
    with TestClient(create_app(Settings.from_env())) as client:
        for key_id, report in reports.items():
            resp = client.get(f"/v1/keys/{key_id}", headers={"Authorization": f"Bearer {admin}"})
            assert resp.status_code == 200, resp.text
            shown = resp.json()["calibration"]
            assert shown["report"] == report and shown["corpus_sha256"] == report["corpus_sha256"]
            assert (shown["n_scored"], shown["n_flagged"], shown["stale"]) == (
                report["fpr"]["scored"],
                report["fpr"]["flagged"],
                False,
            )


def test_a_corpus_that_makes_the_detector_misbehave_is_reported_not_hidden(tmp_path, tokenizer_file):
    key_id = _create_key("--tokenizer", str(tokenizer_file))
    rng = np.random.default_rng(11)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    originals = [_words(rng, 120) for _ in range(40)]
    for i, words in enumerate(originals):
        (corpus / f"doc{i:03}.txt").write_text(" ".join(words))
    for i in range(3):  # exact copies
        (corpus / f"copy{i}.txt").write_text(" ".join(originals[i]))
    for i in range(5):  # near copies: a few words changed
        words = list(originals[10 + i])
        words[5] = words[60] = words[100] = "w499"
        (corpus / f"near{i}.txt").write_text(" ".join(words))
    for i in range(4):  # one-token texts
        (corpus / f"one{i}.txt").write_text(f"w{i}")
    (corpus / "boilerplate.txt").write_text("w1 w2 w3 w4 w5 w6 " * 60)  # repeats: its windows score once
    (corpus / "blank.txt").write_text("  \n ")
    (corpus / "latin1.txt").write_bytes(b"caf\xe9 " * 30)
    result = _invoke("calibrate", str(corpus), "--key", key_id, "--json", "--no-store")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    docs = report["documents"]
    assert (docs["read"], docs["duplicates"], docs["near_duplicates"], docs["empty"]) == (55, 3, 5, 1)
    assert docs["unreadable"] == 1 and docs["too_short"] == 5
    assert report["fpr"]["scored"] == 40 and report["near_duplicates"]["scored"] == 5
    warnings = " | ".join(report["warnings"])
    for said in ("exact copies", "near-duplicates", "5 of 45 documents", "1 unreadable, 1 blank", "only 40"):
        assert said in warnings, warnings
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        assert registry.calibrations.latest(key_id) is None  # --no-store
    shown = _invoke("calibrate", str(corpus), "--key", key_id)  # the table, and the warnings on stderr
    assert shown.exit_code == 0 and "40 scored" in shown.stdout
    assert shown.stderr.count("warning:") == len(report["warnings"])


def test_detect_warns_about_keys_never_calibrated_or_calibrated_under_another_spec(tmp_path, tokenizer_file):
    key_id = _create_key("--tokenizer", str(tokenizer_file))
    text = tmp_path / "a.txt"
    text.write_text(" ".join(_words(np.random.default_rng(1), 80)))
    first = _invoke("detect", str(text))
    assert first.exit_code == 0
    warning = [line for line in first.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"never calibrated: {key_id}" in warning[0], first.stderr
    corpus = tmp_path / "human.jsonl"
    rng = np.random.default_rng(2)
    corpus.write_text("".join(json.dumps({"text": " ".join(_words(rng, 60))}) + "\n" for _ in range(30)))
    assert _invoke("calibrate", str(corpus), "--field", "text").exit_code == 0
    assert "warning" not in _invoke("detect", str(text)).stderr
    with KeyRegistry.open(RegistryConfig.from_env()) as registry, registry.sessions.begin() as session:
        spec = WatermarkSpec.from_dict({**registry.get(key_id).spec.to_dict(), "min_scored_tokens": 20})
        session.execute(update(Key).where(Key.id == key_id).values(spec=spec.to_json()))
    stale = _invoke("detect", str(text), "--json")
    assert f"spec changed since its calibration: {key_id}" in stale.stderr and json.loads(stale.stdout)
    assert "stale: the spec changed since" in " ".join(_invoke("keys", "show", key_id).stdout.split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "one of them"),
        (("x.txt", "--system-corpus", "5"), "one of them"),
        (("--sql", "sqlite://"), "--sql and --query go together"),
        (("--system-corpus", "5", "--qq", "plot.png"), "a .csv table or an .svg figure"),
        (("--system-corpus", "5", "--alpha", "2"), "--alpha must be between 0 and 1"),
        (("--system-corpus", "5", "--confidence", "1"), "--confidence must be between 0 and 1"),
        (("--system-corpus", "5", "--key", "wk_nosuchkey"), "no key with id"),
        (("no/such/dir",), "no such file or directory"),
    ],
)
def test_bad_input_is_a_one_line_error_and_exit_2(tmp_path, tokenizer_file, monkeypatch, args, says):
    _create_key("--tokenizer", str(tokenizer_file))
    monkeypatch.chdir(tmp_path)
    result = _invoke("calibrate", *args)
    assert result.exit_code == 2, result.output
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.output
