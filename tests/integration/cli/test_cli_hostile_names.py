"""Hostile names and records on the command line, each found by a review and pinned: file names
that are not UTF-8 or hold a carriage return, an output that is its own input, a JSON number
too long to read, and brackets that Rich would take for markup."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app

runner = CliRunner()
TEXT = " ".join(f"w{i % 97}" for i in range(80))


def _invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


@pytest.fixture()
def key_id(tmp_path: Path, word_tokenizer_json: bytes) -> str:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    result = _invoke("keys", "create", "k", "--tokenizer", str(path))
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_file_name_that_is_not_utf8_is_scanned_and_written_escaped(tmp_path, key_id, suffix):
    # os.walk hands such a name over with lone surrogates, which strict UTF-8 refused: the whole
    # scan died, and every --resume after it
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "plain.txt").write_text(TEXT)
    with open(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), "w") as f:
        f.write(TEXT)
    out = tmp_path / f"out{suffix}"
    result = _invoke("scan", str(docs), "--out", str(out), "--workers", "0")
    assert result.exit_code == 0, result.output
    with open(out, newline="", encoding="utf-8") as f:  # valid UTF-8 throughout
        rows = list(csv.DictReader(f)) if suffix == ".csv" else [json.loads(line) for line in f]
    assert sorted(Path(row["source"]).name for row in rows) == ["caf\\xe9.txt", "plain.txt"]


def test_a_carriage_return_in_a_file_name_cannot_forge_a_csv_row(tmp_path, key_id):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a\rFORGED.txt").write_text(TEXT)
    (docs / "b.txt").write_text(TEXT)
    out = tmp_path / "out.csv"
    assert _invoke("scan", str(docs), "--out", str(out), "--workers", "0").exit_code == 0
    with open(out, newline="", encoding="utf-8") as f:
        sources = [row["source"] for row in csv.DictReader(f)]
    assert len(sources) == 2 and any(s.endswith("a\rFORGED.txt") for s in sources), sources
    resumed = _invoke("scan", str(docs), "--out", str(out), "--workers", "0", "--resume")
    assert resumed.exit_code == 0, resumed.output  # and the journal reads it back


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, key_id):
    posts = tmp_path / "posts.jsonl"
    posts.write_text(json.dumps({"text": TEXT}) + "\n")
    before = posts.read_bytes()
    for extra in ((), ("--overwrite",)):
        result = _invoke("scan", str(posts), "--field", "text", "--out", str(posts), "--workers", "0", *extra)
        assert result.exit_code == 2 and "is the input" in result.output, result.output
    assert posts.read_bytes() == before  # --overwrite had emptied it


def test_a_json_number_too_long_to_read_is_one_error_row(tmp_path, key_id):
    posts = tmp_path / "posts.jsonl"
    lines = [
        '{"text": "w1 w2", "n": ' + "9" * 5000 + "}",
        json.dumps({"text": TEXT}),
        json.dumps({"text": TEXT}),
    ]
    posts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert _invoke("scan", str(posts), "--field", "text", "--out", str(out), "--workers", "0").exit_code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3, rows  # the records after it were dropped
    assert "a number too long to read" in rows[0]["error"]


def test_brackets_in_names_are_printed_as_they_are(tmp_path, key_id, word_tokenizer_json, monkeypatch):
    odd = tmp_path / "a[" / "]"
    odd.mkdir(parents=True)
    monkeypatch.chdir(odd)  # short relative paths: a table cell does not wrap them
    doc = Path("[red]y.txt")
    doc.write_text(TEXT)
    # brackets were markup: '[/]' a MarkupError traceback, '[red]' swallowed
    detected = _invoke("detect", str(doc))
    assert detected.exit_code == 0 and "[red]y.txt" in detected.stdout, detected.output
    scanned = _invoke("scan", str(doc), "--out", str(odd / "o.jsonl"), "--workers", "0")  # a[/]/o.jsonl
    assert scanned.exit_code == 0 and "a[/]/o.jsonl" in "".join(scanned.stdout.split()), scanned.output
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(word_tokenizer_json)
    evil = _invoke("keys", "create", "e[/]", "--tokenizer", str(tokenizer)).stdout.strip()
    assert "e[/]" in _invoke("keys", "list").stdout
    assert "e[/]" in _invoke("keys", "show", evil).stdout
    assert _invoke("tokens", "create", "--role", "detector", "--name", "b[/]").exit_code == 0
    assert "b[/]" in _invoke("tokens", "list").stdout
    assert _invoke("detect", str(doc), env={"USER": "e[/]", "LOGNAME": "e[/]"}).exit_code == 0
    tail = _invoke("audit", "tail")
    assert tail.exit_code == 0 and "e[/]" in tail.stdout, tail.output
