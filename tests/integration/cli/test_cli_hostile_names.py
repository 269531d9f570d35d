"""Hostile names, records and outputs on the command line, each found by a review and pinned:
file names that are not UTF-8 or hold a carriage return, an output that is its own input, JSON
too long or too deep to read, brackets that Rich would take for markup, a damaged manifest, a
retried commit, and a full stdout: one line and exit 2, never a traceback or lost rows."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app

runner = CliRunner()
TEXT = " ".join(f"w{i % 97}" for i in range(80))


def _invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


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


def test_hostile_inputs_of_other_commands_are_one_line_and_exit_2(tmp_path, key_id):
    record = tmp_path / "rec.json"
    record.write_text('{"prompt_ids": [], "token_ids": [' + "9" * 5000 + '], "text": "x"}')
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    for args, message in (
        (("detect", "--generation", str(record)), "number too long"),
        (("keys", "create", "n", "--tokenizer", str(nested)), "is not a tokenizer.json file"),
        (("scan", str(nested), "--out", str(tmp_path / "o.jsonl"), "--max-doc-bytes", str(10**20)), "1 GiB"),
    ):
        result = _invoke(*args)
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, args


def test_a_damaged_manifest_is_one_line_and_a_retried_commit_writes_its_rows_once(
    tmp_path, key_id, monkeypatch
):
    from wmark.scan.journal import Journal
    from wmark.scan.rows import ScanRow

    out = tmp_path / "o.jsonl"
    journal = Journal.open(out, settings={"s": 1})
    journal.add([ScanRow.failed("a", "", "x"), ScanRow.failed("b", "", "y")])
    real, failed = os.fsync, []

    def fsync_failing_once(fd: int) -> None:
        if not failed:
            failed.append(fd)
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync_failing_once)
    with pytest.raises(OSError):
        journal.commit()
    journal.commit()  # the retry: it appended the rows a second time
    journal.close()
    assert len(out.read_text().splitlines()) == 2
    manifest = out.with_name(out.name + ".manifest.json")
    version = json.loads(manifest.read_text())["version"]
    manifest.write_text(json.dumps({"version": version, "settings": 5}))  # edited by hand
    result = _invoke("scan", str(tmp_path / "none"), "--out", str(out), "--resume")
    assert result.exit_code == 2 and "damaged" in result.output and "Traceback" not in result.output, (
        result.output
    )


def test_a_full_stdout_is_one_line_on_stderr(tmp_path, key_id):
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "wmark.cli", "keys", "list"], stdout=full, stderr=subprocess.PIPE
        )
    assert done.returncode == 2 and done.stderr.decode().strip() == "error: No space left on device"
