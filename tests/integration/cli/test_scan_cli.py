"""`wmark scan` on the command line: registry keys, summary table and JSON, object-store and SQL
sources, one-line errors with exit code 2 on bad input, and that heavy imports stay lazy.

The registry draws a fresh random secret for each key, so a human document's verdict is not
fixed in advance: tests compare with what `Localizer` says under the same key instead.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.detector import Detector
from wmark.detector.localize import Localizer
from wmark.keys import KeyRegistry, RegistryConfig

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _marked(key_id: str, planted, seed: int) -> str:
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(key_id)
    return " ".join(f"w{i - 1}" for i in planted(key, 150, np.random.default_rng(seed)))


def _verdicts(key_id: str, texts: list[str], alpha: float) -> list[str]:
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(key_id)
        tokenizer = registry.tokenizer_json(key.spec.tokenizer.sha256)
    localizer = Localizer(Detector([key], {key.spec.tokenizer.sha256: tokenizer}))
    return [r.verdict for r in localizer.localize_many(texts, alpha=alpha)]


def _human(seed: int) -> str:
    return " ".join(f"w{i}" for i in np.random.default_rng(seed).integers(0, 500, size=150))


@pytest.fixture()
def docs(tmp_path: Path, key_id: str, planted) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "marked.txt").write_text(_marked(key_id, planted, 1), encoding="utf-8")
    (root / "human.txt").write_text(_human(2), encoding="utf-8")
    lines = [json.dumps({"body": _human(10 + i)}) for i in range(30)]
    lines[4] = json.dumps({"body": _marked(key_id, planted, 3)})
    (root / "posts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_scan_prints_a_summary_and_writes_rows(docs, tmp_path, key_id):
    out = tmp_path / "out.jsonl"
    result = _invoke(
        "scan", str(docs), "--field", "body", "--out", str(out), "--workers", "0", "--alpha", "1e-4"
    )
    assert result.exit_code == 0, result.output
    assert "watermarked" in result.stdout and "not_detected" in result.stdout and key_id in result.stdout
    assert "docs/s" in result.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 32
    marked = {(Path(r["source"]).name, r["doc_id"]) for r in rows if r["verdict"] == "watermarked"}
    assert {("marked.txt", ""), ("posts.jsonl", "line:5")} <= marked
    texts = [(docs / "human.txt").read_text()] + [
        json.loads(line)["body"] for line in (docs / "posts.jsonl").read_text().splitlines()
    ]
    expected = _verdicts(key_id, texts, 1e-4)
    assert [r["verdict"] for r in rows if not r["source"].endswith("marked.txt")] == expected

    again = _invoke(
        "scan", str(docs), "--field", "body", "--out", str(out), "--resume", "--json", "--alpha", "1e-4"
    )
    summary = json.loads(again.stdout)
    assert summary["documents"] == 32 and summary["run_documents"] == 0
    assert summary["by_key"] == {key_id: len(marked)}

    # Each finished run leaves one audit row that certifies the results file by its SHA-256.
    audit = [
        json.loads(line)
        for line in _invoke("audit", "tail", "--json", "--action", "scan").stdout.splitlines()
    ]
    assert len(audit) == 2 and all(r["key_ids"] == [key_id] for r in audit)
    assert audit[-1]["text_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert audit[-1]["result"]["documents"] == 32
    assert _invoke("audit", "verify").exit_code == 0


def test_scan_selected_key_json_summary_and_memory_store(tmp_path, key_id, planted):
    fs = fsspec.filesystem("memory")
    human = _human(6)
    fs.pipe({"/cli-bucket/a.md": _marked(key_id, planted, 5).encode(), "/cli-bucket/b.md": human.encode()})
    try:
        out = tmp_path / "out.csv"
        result = _invoke(
            "scan", "memory://cli-bucket", "--key", key_id, "--out", str(out), "--json", "--workers", "0"
        )
    finally:
        fs.rm("/cli-bucket", recursive=True)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    verdicts = sorted(["watermarked", *_verdicts(key_id, [human], 0.01)])
    assert summary["by_verdict"] == {v: verdicts.count(v) for v in verdicts}
    assert out.read_text().splitlines()[0].startswith("source,doc_id,verdict,p_value")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def table_url(request, tmp_path) -> str:
    url = (
        f"sqlite:///{tmp_path / 'forum.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE posts (post_id INTEGER PRIMARY KEY, body TEXT)"))
        conn.execute(
            text("INSERT INTO posts VALUES (:i, :b)"), [{"i": i, "b": _human(100 + i)} for i in range(1, 51)]
        )
    engine.dispose()
    return url


def test_scan_a_sql_table(table_url, tmp_path, key_id):
    out = tmp_path / "posts.jsonl"
    result = _invoke(
        "scan", "--sql", table_url, "--query", "SELECT post_id, body FROM posts", "--out", str(out), "--json",
        "--workers", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(int(r["doc_id"]) for r in rows) == list(range(1, 51))
    assert json.loads(result.stdout)["documents"] == 50


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "docx"], "unknown format 'docx'"),
        ([], "--field"),
        (["--field", "body", "--key", "wk_000000000000"], "no key with id"),
        (["--field", "body", "--alpha", "2"], "--alpha"),
        (["--field", "body", "--window", "-1"], "--window"),
        (["--field", "body", "--workers", "-1"], "--workers"),
        (["--field", "body", "--max-doc-bytes", "0"], "--max-doc-bytes"),
        (["--field", "body", "--max-ratio", "0"], "--max-ratio"),
    ],
    ids=[
        "unknown-format",
        "missing-field",
        "unknown-key",
        "bad-alpha",
        "bad-window",
        "bad-workers",
        "bad-max-doc-bytes",
        "bad-max-ratio",
    ],
)
def test_bad_input_is_one_line_and_exit_2(docs, tmp_path, key_id, args, message):
    result = _invoke("scan", str(docs), "--out", str(tmp_path / "out.jsonl"), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--sql", "postgresql+psycopg://nobody@127.0.0.1:9/none", "--query", "SELECT 1, 2"],
            "cannot connect",
        ),
        (["--sql", "sqlite:///x.db"], "--sql and --query go together"),
        (["/no/such/dir"], "no such file or directory"),
        (["nosuch://bucket/x"], "Protocol not known"),
    ],
    ids=["unreachable-sql", "sql-without-query", "missing-path", "unknown-protocol"],
)
def test_bad_sources_are_one_line_and_exit_2(tmp_path, key_id, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("w1 w2 w3", encoding="utf-8")
    result = _invoke("scan", "--out", str(tmp_path / "out.jsonl"), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_output_and_resume_conflicts_exit_2(docs, tmp_path, key_id):
    result = _invoke("scan", str(docs), "--field", "body", "--out", str(tmp_path / "out.txt"))
    assert result.exit_code == 2 and "extension" in result.stderr
    out = str(tmp_path / "out.jsonl")
    assert _invoke("scan", str(docs), "--field", "body", "--out", out, "--workers", "0").exit_code == 0
    exists = _invoke("scan", str(docs), "--field", "body", "--out", out)
    assert exists.exit_code == 2 and "--resume" in exists.stderr
    changed = _invoke("scan", str(docs), "--field", "body", "--out", out, "--resume", "--alpha", "0.05")
    assert changed.exit_code == 2 and "other settings (alpha)" in changed.stderr


def test_no_keys_in_the_registry_is_exit_2(tmp_path):
    (tmp_path / "a.txt").write_text("w1 w2", encoding="utf-8")
    result = _invoke("scan", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 2 and "no keys" in result.stderr


def test_help_explains_sources_windows_and_resume():
    result = _invoke("scan", "--help")
    assert result.exit_code == 0
    for word in (
        "--field",
        "--column",
        "--sql",
        "--query",
        "--resume",
        "--dask",
        "--window",
        "--workers",
        "--follow-links",
        "--max-doc-bytes",
        "--max-ratio",
        "s3://",
    ):
        assert word in result.stdout


def test_heavy_scan_dependencies_are_imported_lazily():
    code = (
        "import sys\n"
        "import wmark.detector, wmark.scan.scan, wmark.cli.main\n"
        "heavy = [m for m in ('fsspec', 'pyarrow', 'dask', 'distributed') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("workers", ["0", "1"])
def test_one_bad_record_is_one_error_row_in_a_fresh_process(tmp_path, key_id, workers):
    # The reproduction, in a fresh interpreter (where `concurrent.futures.process` is not
    # imported by anything else): the bad record is one error row, the good one is scanned.
    source = tmp_path / "s.jsonl"
    source.write_text('{"text":"w1 w2 w3"}\n{"text":"\\ud800"}\n', encoding="utf-8")
    out = tmp_path / "o.jsonl"
    command = [sys.executable, "-m", "wmark.cli", "scan", str(source), "--field", "text"]
    done = subprocess.run(
        [*command, "--out", str(out), "--workers", workers], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["doc_id"], r["verdict"]) for r in rows] == [
        ("line:1", "insufficient_evidence"),
        ("line:2", "error"),
    ]
    assert "unpaired surrogate" in rows[1]["error"]


def test_a_corrupt_compressed_file_is_an_error_row(tmp_path, key_id):
    root = tmp_path / "d"
    root.mkdir()
    (root / "x.md.xz").write_bytes(np.random.default_rng(6).bytes(500))  # as `head -c 500 /dev/urandom`
    (root / "a.txt").write_text(_human(7), encoding="utf-8")
    out = tmp_path / "o.jsonl"
    result = _invoke("scan", str(root), "--out", str(out), "--workers", "0")
    assert result.exit_code == 0, result.output
    rows = {Path(r["source"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["a.txt"]["verdict"] != "error"
    assert rows["x.md.xz"]["verdict"] == "error" and "LZMAError" in rows["x.md.xz"]["error"]


def test_links_out_of_the_scanned_folder_are_not_read_unless_asked(tmp_path, key_id):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(_human(8), encoding="utf-8")
    root = tmp_path / "d"
    root.mkdir()
    (root / "a.txt").write_text(_human(9), encoding="utf-8")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    out = tmp_path / "o.jsonl"
    assert _invoke("scan", str(root), "--out", str(out), "--workers", "0").exit_code == 0
    rows = {Path(r["source"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["link.txt"]["verdict"] == "error" and "--follow-links" in rows["link.txt"]["error"]
    assert rows["link.txt"]["n_tokens"] is None  # never read
    followed = tmp_path / "f.jsonl"
    result = _invoke("scan", str(root), "--out", str(followed), "--workers", "0", "--follow-links")
    assert result.exit_code == 0, result.output
    rows = {Path(r["source"]).name: r for r in map(json.loads, followed.read_text().splitlines())}
    assert rows["link.txt"]["verdict"] != "error" and rows["link.txt"]["n_tokens"] == 150


def test_a_bomb_is_one_error_row_naming_the_limit_in_a_fresh_process(tmp_path, key_id):
    # The reproduction with a worker process: a .gz of 50 MB of zeros (50 KB on disk) used
    # to kill the worker three times and leave a row that did not say why; under a 1 MiB limit it
    # is one error row that names the limit, read in the driver, and the other file is scanned.
    root = tmp_path / "d"
    root.mkdir()
    with gzip.open(root / "bomb.txt.gz", "wb", compresslevel=1) as fh:
        for _ in range(50):
            fh.write(bytes(1 << 20))
    (root / "a.txt").write_text(_human(11), encoding="utf-8")
    out = tmp_path / "o.jsonl"
    command = [sys.executable, "-m", "wmark.cli", "scan", str(root), "--out", str(out)]
    done = subprocess.run(
        [*command, "--workers", "1", "--max-doc-bytes", str(1 << 20)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {Path(r["source"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["bomb.txt.gz"]["error"] == "document over --max-doc-bytes (1 MiB) after decompression"
    assert rows["a.txt"]["verdict"] != "error" and rows["a.txt"]["n_tokens"] == 150
