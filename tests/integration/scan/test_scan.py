"""Scans end to end through `wmark.scan.scan`: every output format, in-process, a local
process pool and a real Dask LocalCluster, resume and its refusals, the journal, SQL tables.
(Workers that fail: `test_scan_failures.py`; the store and its documents: `conftest.py`.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from wmark.errors import InputError
from wmark.scan.journal import Journal
from wmark.scan.rows import COLUMNS, ScanRow
from wmark.scan.scan import scan
from wmark.scan.workers import detect_batch


def test_one_row_per_document_with_verdicts_errors_and_summary(corpus, tmp_path, scans):
    root, marked = corpus
    out = tmp_path / "out.jsonl"
    summary = scans.run(root, out)
    rows = scans.jsonl(out)
    assert len(rows) == scans.corpus_docs == summary.documents
    ids = [(r["source"], r["doc_id"]) for r in rows]
    assert len(set(ids)) == len(ids)
    assert list(rows[0]) == list(COLUMNS)
    flagged = {(r["source"], r["doc_id"]) for r in rows if r["verdict"] == "watermarked"}
    assert flagged == marked
    assert all(
        r["key_id"] == scans.key.key_id and r["p_value"] < 1e-6 for r in rows if r["verdict"] == "watermarked"
    )
    errors = {(Path(r["source"]).name, r["doc_id"]): r["error"] for r in rows if r["verdict"] == "error"}
    assert errors == {
        ("posts.jsonl", "line:301"): errors[("posts.jsonl", "line:301")],
        ("latin1.txt", ""): "not UTF-8 text (byte 3 is invalid)",
        ("blank.txt", ""): "the text is empty",
    }
    assert "invalid JSON" in errors[("posts.jsonl", "line:301")]
    assert summary.by_verdict == {
        "error": 3,
        "not_detected": scans.corpus_docs - 3 - len(marked),
        "watermarked": len(marked),
    }
    assert summary.by_key == {scans.key.key_id: len(marked)}
    assert summary.run_documents == scans.corpus_docs and summary.resumed == 0 and summary.docs_per_s > 0
    marked_row = next(r for r in rows if r["source"].endswith("marked.txt"))
    assert marked_row["window_start_char"] is not None and marked_row["n_windows"] >= 1
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["complete"] and manifest["committed_rows"] == scans.corpus_docs
    assert manifest["summary"]["by_verdict"] == summary.by_verdict


def test_jsonl_csv_and_parquet_outputs_hold_the_same_rows(corpus, tmp_path, scans):
    root, _ = corpus
    for name in ("out.jsonl", "out.csv", "out.parquet"):
        scans.run(root, tmp_path / name)
    from_jsonl = scans.jsonl(tmp_path / "out.jsonl")
    from_parquet = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert from_parquet == from_jsonl
    assert pq.read_schema(tmp_path / "out.parquet").field("p_value").type == pa.float64()
    assert not (tmp_path / "out.parquet.spool.jsonl").exists()
    import csv

    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
        from_csv = list(csv.DictReader(f))
    assert [r["doc_id"] for r in from_csv] == [r["doc_id"] for r in from_jsonl]
    for c, j in zip(from_csv, from_jsonl, strict=True):
        assert c["verdict"] == j["verdict"] and c["error"] == (j["error"] or "")
        assert (c["p_value"] == "") if j["p_value"] is None else float(c["p_value"]) == j["p_value"]


def test_process_pool_gives_the_same_output_as_in_process(corpus, tmp_path, scans):
    root, _ = corpus
    scans.run(root, tmp_path / "inline.jsonl")
    scans.run(root, tmp_path / "pool.jsonl", workers=2, batch_docs=16)
    assert (tmp_path / "pool.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()


def test_dask_local_cluster_gives_the_same_output_as_in_process(corpus, tmp_path, scans):
    root, _ = corpus
    scans.run(root, tmp_path / "inline.jsonl")
    summary = scans.run(root, tmp_path / "dask.jsonl", dask="local", workers=2, batch_docs=16)
    assert (tmp_path / "dask.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()
    assert summary.documents == scans.corpus_docs


def test_interrupted_scan_resumes_to_the_uninterrupted_output(corpus, tmp_path, scans):
    root, _ = corpus
    scans.run(root, tmp_path / "whole.jsonl")
    out = tmp_path / "out.jsonl"

    def interrupt(progress):
        if progress.documents >= 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        scans.run(root, out, batch_docs=8, on_progress=interrupt)
    partial = scans.jsonl(out)
    assert 100 <= len(partial) < scans.corpus_docs  # what was finished in order is committed
    assert json.loads((tmp_path / "out.jsonl.manifest.json").read_text())["committed_rows"] == len(partial)
    with pytest.raises(InputError, match="--resume"):
        scans.run(root, out)
    summary = scans.run(root, out, resume=True)
    assert summary.resumed == len(partial) and summary.run_documents == scans.corpus_docs - len(partial)
    assert summary.documents == scans.corpus_docs
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    again = scans.run(root, out, resume=True)  # finished: nothing to do
    assert again.run_documents == 0 and again.by_verdict == summary.by_verdict


@pytest.mark.parametrize("name", ["out.jsonl", "out.csv", "out.parquet"])
def test_a_torn_commit_is_cut_off_on_resume(corpus, tmp_path, scans, name):
    root, _ = corpus
    reference = tmp_path / f"whole-{name}"
    scans.run(root, reference)
    out = tmp_path / name

    def interrupt(progress):
        if progress.documents >= 50:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        scans.run(root, out, batch_docs=8, on_progress=interrupt)
    data = out if not name.endswith("parquet") else tmp_path / f"{name}.spool.jsonl"
    with open(data, "ab") as f:  # half a chunk written when the power went
        f.write(b'{"source": "torn", "doc_id": "row:0", "verdict": "watermar')
    scans.run(root, out, resume=True)
    if name.endswith("parquet"):
        assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()
    else:
        assert out.read_bytes() == reference.read_bytes()


def test_resume_refuses_other_settings_and_overwrite_starts_again(corpus, tmp_path, scans):
    root, _ = corpus
    out = tmp_path / "out.jsonl"
    scans.run(root, out)
    with pytest.raises(InputError, match="alpha"):
        scan(
            urls=[str(root)],
            options=scans.options,
            keys=[scans.key],
            tokenizers=scans.tokenizers,
            out=out,
            alpha=0.05,
            resume=True,
            workers=0,
        )
    with pytest.raises(InputError, match="min_window"):
        scans.run(root, out, resume=True, min_window=64)
    out.write_text("garbage\n")
    summary = scans.run(root, out, overwrite=True)
    assert summary.documents == scans.corpus_docs and len(scans.jsonl(out)) == scans.corpus_docs
    (tmp_path / "out.jsonl.manifest.json").unlink()
    with pytest.raises(InputError, match="no manifest"):
        scans.run(root, out, resume=True)


def test_two_scans_cannot_write_one_output(tmp_path):
    first = Journal.open(tmp_path / "out.jsonl", settings={"a": 1})
    try:
        with pytest.raises(InputError, match="another scan"):
            Journal.open(tmp_path / "out.jsonl", settings={"a": 1}, resume=True)
    finally:
        first.close()


def test_the_output_and_its_manifest_are_not_scanned_when_inside_the_store(corpus, scans):
    root, _ = corpus
    out = root / "results.jsonl"
    scans.run(root, out)
    again = scans.run(root, out, overwrite=True)
    assert again.documents == scans.corpus_docs
    assert not any(r["source"].startswith(str(out)) for r in scans.jsonl(out))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def posts_url(request, tmp_path, planted, scans) -> str:
    url = (
        f"sqlite:///{tmp_path / 'posts.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    rng = np.random.default_rng(4)
    rows = [{"id": i, "body": scans.human(rng)} for i in range(1, 201)]
    rows[41]["body"] = scans.words(planted(scans.key, 150, rng))  # id 42
    rows.append({"id": 500, "body": None})
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE posts (id INTEGER PRIMARY KEY, body TEXT)"))
        conn.execute(text("INSERT INTO posts (id, body) VALUES (:id, :body)"), rows)
    engine.dispose()
    return url


def test_sql_table_scan(posts_url, tmp_path, scans):
    out = tmp_path / "posts.parquet"
    summary = scan(
        sql=posts_url,
        query="SELECT id, body FROM posts ORDER BY id",
        keys=[scans.key],
        tokenizers=scans.tokenizers,
        out=out,
        alpha=scans.alpha,
        workers=0,
    )
    rows = pq.read_table(out).to_pylist()
    assert [r["doc_id"] for r in rows] == [str(i) for i in range(1, 201)] + ["500"]
    assert [r["doc_id"] for r in rows if r["verdict"] == "watermarked"] == ["42"]
    assert rows[-1]["verdict"] == "error" and rows[-1]["error"] == "the text is NULL"
    assert summary.by_verdict == {"error": 1, "not_detected": 199, "watermarked": 1}


def test_scan_rows_carry_window_fields(planted, scans):
    config = scans.config
    rng = np.random.default_rng(6)
    text_ = (
        scans.human(rng, 600) + " " + scans.words(planted(scans.key, 150, rng)) + " " + scans.human(rng, 600)
    )
    (row,) = detect_batch(config.build(), scans.alpha, (("src", "1", text_),))
    assert isinstance(row, ScanRow) and row.verdict == "watermarked"
    assert row.window_start is not None and row.window_end is not None
    assert min(row.window_end, 750) - max(row.window_start, 600) >= 100  # the passage is tokens 600..750
    assert (
        row.window_p_value is not None
        and row.window_p_raw is not None
        and row.window_p_raw <= row.window_p_value
    )
    assert (
        text_[row.window_start_char : row.window_end_char].split()
        == text_.split()[row.window_start : row.window_end]
    )


def test_an_unreachable_dask_scheduler_is_an_input_error_and_leaves_no_output(scans, tmp_path):
    from wmark.scan.workers import DaskExecutor

    config = scans.config
    with pytest.raises(InputError, match="cannot reach the scheduler"):
        DaskExecutor(config, "tcp://127.0.0.1:9", 1, connect_timeout=1)
    (tmp_path / "a.txt").write_text("w1 w2 w3", encoding="utf-8")
    with pytest.raises(InputError, match="--workers"):
        scans.run(tmp_path / "a.txt", tmp_path / "out.jsonl", workers=-1)
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.jsonl.manifest.json").exists()


def test_abandoning_a_new_output_removes_it_but_keeps_committed_work(tmp_path):
    fresh = Journal.open(tmp_path / "new.jsonl", settings={"a": 1})
    fresh.abandon()
    assert not (tmp_path / "new.jsonl").exists() and not (tmp_path / "new.jsonl.manifest.json").exists()
    kept = Journal.open(tmp_path / "kept.jsonl", settings={"a": 1})
    kept.add([ScanRow.failed("s", "1", "x")])
    kept.commit()
    kept.abandon()
    resumed = Journal.open(tmp_path / "kept.jsonl", settings={"a": 1}, resume=True)
    try:
        assert resumed.done == {("s", "1")}
    finally:
        resumed.close()


def test_an_output_that_cannot_be_written_is_an_input_error(tmp_path):
    (tmp_path / "out.jsonl").mkdir()  # a directory where the output file should go
    with pytest.raises(InputError, match="cannot write there"):
        Journal.open(tmp_path / "out.jsonl", settings={}, overwrite=True)
    with pytest.raises(InputError, match="does not exist"):
        Journal.open(tmp_path / "missing" / "out.jsonl", settings={})
