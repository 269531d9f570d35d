"""Scans end to end through `wmark.scan.scan`: every output format, in-process, a local
process pool and a real Dask LocalCluster, resume and its refusals, worker failures, SQL tables.

Keys have fixed secrets; watermarked documents carry a real (planted) keyed-race watermark, human
ones are i.i.d. words, so at alpha = 1e-4 a wrong verdict has probability < 1e-4 per document.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from wmark.errors import InputError
from wmark.scan.journal import Journal
from wmark.scan.loop import run_scan
from wmark.scan.rows import COLUMNS, ScanRow
from wmark.scan.scan import scan
from wmark.scan.sources import Document, SourceOptions
from wmark.scan.workers import Batch, InlineExecutor, PoolExecutor, WorkerConfig, detect_batch

ALPHA = 1e-4
OPTIONS = SourceOptions(field="text", column="text")


def _words(ids) -> str:
    return " ".join(f"w{i - 1}" for i in ids)


def _human(rng: np.random.Generator, n: int = 120) -> str:
    return " ".join(f"w{i}" for i in rng.integers(0, 500, size=n))


@pytest.fixture()
def corpus(tmp_path: Path, word_key, planted) -> tuple[Path, set[tuple[str, str]]]:
    """A folder of every format; returns it and the identities of the watermarked documents."""
    rng = np.random.default_rng(1)
    root = tmp_path / "docs"
    (root / "deep").mkdir(parents=True)
    marked: set[tuple[str, str]] = set()
    (root / "marked.txt").write_text(_words(planted(word_key, 150, rng)), encoding="utf-8")
    marked.add((str(root / "marked.txt"), ""))
    (root / "human.md").write_text(_human(rng), encoding="utf-8")
    lines = []
    for i in range(1, 301):
        if i % 50 == 0:
            lines.append(json.dumps({"text": _words(planted(word_key, 120, rng))}))
            marked.add((str(root / "deep" / "posts.jsonl"), f"line:{i}"))
        else:
            lines.append(json.dumps({"text": _human(rng)}))
    lines.append("{broken json")
    (root / "deep" / "posts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    texts = [_human(rng) for _ in range(40)]
    texts[7] = _words(planted(word_key, 120, rng))
    marked.add((str(root / "table.parquet"), "row:7"))
    pq.write_table(pa.table({"text": texts}), root / "table.parquet")
    (root / "c.csv").write_text("text\n" + "\n".join(_human(rng) for _ in range(20)) + "\n", encoding="utf-8")
    (root / "latin1.txt").write_bytes("caf\xe9 w1 w2".encode("latin-1"))
    (root / "blank.txt").write_text("  \n", encoding="utf-8")
    return root, marked


def _scan(root: Path, out: Path, key, tokenizer_json: bytes, **kw: Any):
    return scan(
        urls=[str(root)],
        options=OPTIONS,
        keys=[key],
        tokenizers={key.spec.tokenizer.sha256: tokenizer_json},
        out=out,
        alpha=ALPHA,
        **{"workers": 0, **kw},
    )


def _config(key, tokenizer_json: bytes) -> WorkerConfig:
    return WorkerConfig(
        keys=(key,), tokenizers={key.spec.tokenizer.sha256: tokenizer_json}, alpha=ALPHA, min_window=32
    )


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


N_DOCS = 2 + 301 + 40 + 20 + 2


def test_one_row_per_document_with_verdicts_errors_and_summary(
    corpus, tmp_path, word_key, word_tokenizer_json
):
    root, marked = corpus
    out = tmp_path / "out.jsonl"
    summary = _scan(root, out, word_key, word_tokenizer_json)
    rows = _jsonl(out)
    assert len(rows) == N_DOCS == summary.documents
    ids = [(r["source"], r["doc_id"]) for r in rows]
    assert len(set(ids)) == len(ids)
    assert list(rows[0]) == list(COLUMNS)
    flagged = {(r["source"], r["doc_id"]) for r in rows if r["verdict"] == "watermarked"}
    assert flagged == marked
    assert all(
        r["key_id"] == word_key.key_id and r["p_value"] < 1e-6 for r in rows if r["verdict"] == "watermarked"
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
        "not_detected": N_DOCS - 3 - len(marked),
        "watermarked": len(marked),
    }
    assert summary.by_key == {word_key.key_id: len(marked)}
    assert summary.run_documents == N_DOCS and summary.resumed == 0 and summary.docs_per_s > 0
    marked_row = next(r for r in rows if r["source"].endswith("marked.txt"))
    assert marked_row["window_start_char"] is not None and marked_row["n_windows"] >= 1
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["complete"] and manifest["committed_rows"] == N_DOCS
    assert manifest["summary"]["by_verdict"] == summary.by_verdict


def test_jsonl_csv_and_parquet_outputs_hold_the_same_rows(corpus, tmp_path, word_key, word_tokenizer_json):
    root, _ = corpus
    for name in ("out.jsonl", "out.csv", "out.parquet"):
        _scan(root, tmp_path / name, word_key, word_tokenizer_json)
    from_jsonl = _jsonl(tmp_path / "out.jsonl")
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


def test_process_pool_gives_the_same_output_as_in_process(corpus, tmp_path, word_key, word_tokenizer_json):
    root, _ = corpus
    _scan(root, tmp_path / "inline.jsonl", word_key, word_tokenizer_json)
    _scan(root, tmp_path / "pool.jsonl", word_key, word_tokenizer_json, workers=2, batch_docs=16)
    assert (tmp_path / "pool.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()


def test_dask_local_cluster_gives_the_same_output_as_in_process(
    corpus, tmp_path, word_key, word_tokenizer_json
):
    root, _ = corpus
    _scan(root, tmp_path / "inline.jsonl", word_key, word_tokenizer_json)
    summary = _scan(
        root, tmp_path / "dask.jsonl", word_key, word_tokenizer_json, dask="local", workers=2, batch_docs=16
    )
    assert (tmp_path / "dask.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()
    assert summary.documents == N_DOCS


def test_interrupted_scan_resumes_to_the_uninterrupted_output(
    corpus, tmp_path, word_key, word_tokenizer_json
):
    root, _ = corpus
    _scan(root, tmp_path / "whole.jsonl", word_key, word_tokenizer_json)
    out = tmp_path / "out.jsonl"

    def interrupt(progress):
        if progress.documents >= 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _scan(root, out, word_key, word_tokenizer_json, batch_docs=8, on_progress=interrupt)
    partial = _jsonl(out)
    assert 100 <= len(partial) < N_DOCS  # what was finished in order is committed
    assert json.loads((tmp_path / "out.jsonl.manifest.json").read_text())["committed_rows"] == len(partial)
    with pytest.raises(InputError, match="--resume"):
        _scan(root, out, word_key, word_tokenizer_json)
    summary = _scan(root, out, word_key, word_tokenizer_json, resume=True)
    assert summary.resumed == len(partial) and summary.run_documents == N_DOCS - len(partial)
    assert summary.documents == N_DOCS
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    again = _scan(root, out, word_key, word_tokenizer_json, resume=True)  # finished: nothing to do
    assert again.run_documents == 0 and again.by_verdict == summary.by_verdict


@pytest.mark.parametrize("name", ["out.jsonl", "out.csv", "out.parquet"])
def test_a_torn_commit_is_cut_off_on_resume(corpus, tmp_path, word_key, word_tokenizer_json, name):
    root, _ = corpus
    reference = tmp_path / f"whole-{name}"
    _scan(root, reference, word_key, word_tokenizer_json)
    out = tmp_path / name

    def interrupt(progress):
        if progress.documents >= 50:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _scan(root, out, word_key, word_tokenizer_json, batch_docs=8, on_progress=interrupt)
    data = out if not name.endswith("parquet") else tmp_path / f"{name}.spool.jsonl"
    with open(data, "ab") as f:  # half a chunk written when the power went
        f.write(b'{"source": "torn", "doc_id": "row:0", "verdict": "watermar')
    _scan(root, out, word_key, word_tokenizer_json, resume=True)
    if name.endswith("parquet"):
        assert pq.read_table(out).to_pylist() == pq.read_table(reference).to_pylist()
    else:
        assert out.read_bytes() == reference.read_bytes()


def test_resume_refuses_other_settings_and_overwrite_starts_again(
    corpus, tmp_path, word_key, word_tokenizer_json
):
    root, _ = corpus
    out = tmp_path / "out.jsonl"
    _scan(root, out, word_key, word_tokenizer_json)
    with pytest.raises(InputError, match="alpha"):
        scan(
            urls=[str(root)],
            options=OPTIONS,
            keys=[word_key],
            tokenizers={word_key.spec.tokenizer.sha256: word_tokenizer_json},
            out=out,
            alpha=0.05,
            resume=True,
            workers=0,
        )
    with pytest.raises(InputError, match="min_window"):
        _scan(root, out, word_key, word_tokenizer_json, resume=True, min_window=64)
    out.write_text("garbage\n")
    summary = _scan(root, out, word_key, word_tokenizer_json, overwrite=True)
    assert summary.documents == N_DOCS and len(_jsonl(out)) == N_DOCS
    (tmp_path / "out.jsonl.manifest.json").unlink()
    with pytest.raises(InputError, match="no manifest"):
        _scan(root, out, word_key, word_tokenizer_json, resume=True)


def test_two_scans_cannot_write_one_output(tmp_path):
    first = Journal.open(tmp_path / "out.jsonl", settings={"a": 1})
    try:
        with pytest.raises(InputError, match="another scan"):
            Journal.open(tmp_path / "out.jsonl", settings={"a": 1}, resume=True)
    finally:
        first.close()


def test_the_output_and_its_manifest_are_not_scanned_when_inside_the_store(
    corpus, word_key, word_tokenizer_json
):
    root, _ = corpus
    out = root / "results.jsonl"
    _scan(root, out, word_key, word_tokenizer_json)
    again = _scan(root, out, word_key, word_tokenizer_json, overwrite=True)
    assert again.documents == N_DOCS
    assert not any(r["source"].startswith(str(out)) for r in _jsonl(out))


class _FlakyExecutor:
    """A fake executor: batches containing `poison` always fail, others fail on first try."""

    slots = 2
    generation = 0

    def __init__(self, config: WorkerConfig) -> None:
        self.localizer = config.build()
        self.alpha = config.alpha
        self.seen: set[Batch] = set()
        self.restarts = 0

    def submit(self, batch: Batch) -> cf.Future:
        future: cf.Future = cf.Future()
        if any(t == "poison" for _, _, t in batch) or batch not in self.seen:
            self.seen.add(batch)
            future.set_exception(cf.process.BrokenProcessPool("a worker died"))
        else:
            future.set_result(detect_batch(self.localizer, self.alpha, batch))
        return future

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:  # noqa: ARG002
        return list(futures)

    def restart(self) -> None:
        self.restarts += 1
        self.generation += 1

    def close(self) -> None:
        pass


def _run_batches_of_5(tmp_path, docs: list[Document], executor) -> tuple[Any, list[dict]]:  # noqa: ANN001
    """`docs` scanned on a fake `executor` in batches of 5 into a new journal: the summary and rows."""
    journal = Journal.open(tmp_path / "out.jsonl", settings={})
    try:
        summary = run_scan(iter(docs), journal=journal, executor=executor, batch_docs=5)
    finally:
        journal.close()
    return summary, _jsonl(tmp_path / "out.jsonl")


def test_failed_batches_run_again_alone_and_split_until_the_failing_document_is_alone(
    tmp_path, word_key, word_tokenizer_json
):
    rng = np.random.default_rng(3)
    docs = [Document("mem", f"row:{i}", _human(rng), None, 10) for i in range(20)]
    docs[13] = Document("mem", "row:13", "poison", None, 10)
    executor = _FlakyExecutor(_config(word_key, word_tokenizer_json))
    summary, rows = _run_batches_of_5(tmp_path, docs, executor)
    assert [r["doc_id"] for r in rows] == [f"row:{i}" for i in range(20)]
    failed = [r["doc_id"] for r in rows if r["verdict"] == "error"]
    # every batch fails on its first try and runs again alone; row:13's (10-14) fails alone too,
    # so it is split, and its halves, until row:13 fails alone twice
    assert failed == ["row:13"]
    assert "BrokenProcessPool" in rows[13]["error"]
    assert summary.by_verdict == {"error": 1, "not_detected": 19}
    assert executor.restarts >= 1


class _BreakingExecutor(_FlakyExecutor):
    """A fake executor whose pool breaks after `healthy` batches: from then until `restart`,
    `submit` raises BrokenProcessPool itself (as ProcessPoolExecutor does once it has noticed a
    dead worker) and the batches it held fail with it."""

    def __init__(self, config: WorkerConfig, healthy: int) -> None:
        super().__init__(config)
        self.healthy = healthy
        self.held: dict[cf.Future, Batch] = {}

    def submit(self, batch: Batch) -> cf.Future:
        if self.healthy == 0:
            for future in self.held:
                if not future.done():
                    future.set_exception(cf.process.BrokenProcessPool("a worker died"))
            raise cf.process.BrokenProcessPool("a child process terminated abruptly")
        self.healthy -= 1
        future: cf.Future = cf.Future()
        self.held[future] = batch  # finishes on the next wait, unless the pool breaks first
        return future

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:  # noqa: ARG002
        for future in futures:
            if not future.done():
                future.set_result(detect_batch(self.localizer, self.alpha, self.held[future]))
        return list(futures)

    def restart(self) -> None:
        super().restart()
        self.healthy = -1  # healthy for good


def test_a_pool_that_refuses_new_work_is_restarted_and_nothing_is_lost(
    tmp_path, word_key, word_tokenizer_json
):
    """Submitting to a pool whose worker was killed between two collects raises at once (no
    future to fail): the scan restarts the pool and runs the refused batch again, as it does
    the batches the pool held (the race that a killed worker in a real pool can hit)."""
    rng = np.random.default_rng(4)
    docs = [Document("mem", f"row:{i}", _human(rng), None, 10) for i in range(20)]
    executor = _BreakingExecutor(_config(word_key, word_tokenizer_json), healthy=2)
    summary, rows = _run_batches_of_5(tmp_path, docs, executor)
    assert [r["doc_id"] for r in rows] == [f"row:{i}" for i in range(20)]
    assert summary.by_verdict == {"not_detected": 20}
    assert executor.restarts == 1


def test_a_killed_pool_worker_is_replaced_and_nothing_is_lost(
    corpus, tmp_path, word_key, word_tokenizer_json
):
    root, _ = corpus
    _scan(root, tmp_path / "inline.jsonl", word_key, word_tokenizer_json)
    killed: list[int] = []

    def kill_a_worker(progress):
        if not killed and progress.documents >= 20:
            children = multiprocessing.active_children()
            assert children, "the pool has no processes"
            killed.append(children[0].pid)
            os.kill(children[0].pid, signal.SIGKILL)

    _scan(
        root,
        tmp_path / "pool.jsonl",
        word_key,
        word_tokenizer_json,
        workers=2,
        batch_docs=4,
        on_progress=kill_a_worker,
    )
    assert killed
    assert (tmp_path / "pool.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def posts_url(request, tmp_path, word_key, planted) -> str:
    url = (
        f"sqlite:///{tmp_path / 'posts.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    rng = np.random.default_rng(4)
    rows = [{"id": i, "body": _human(rng)} for i in range(1, 201)]
    rows[41]["body"] = _words(planted(word_key, 150, rng))  # id 42
    rows.append({"id": 500, "body": None})
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE posts (id INTEGER PRIMARY KEY, body TEXT)"))
        conn.execute(text("INSERT INTO posts (id, body) VALUES (:id, :body)"), rows)
    engine.dispose()
    return url


def test_sql_table_scan(posts_url, tmp_path, word_key, word_tokenizer_json):
    out = tmp_path / "posts.parquet"
    summary = scan(
        sql=posts_url,
        query="SELECT id, body FROM posts ORDER BY id",
        keys=[word_key],
        tokenizers={word_key.spec.tokenizer.sha256: word_tokenizer_json},
        out=out,
        alpha=ALPHA,
        workers=0,
    )
    rows = pq.read_table(out).to_pylist()
    assert [r["doc_id"] for r in rows] == [str(i) for i in range(1, 201)] + ["500"]
    assert [r["doc_id"] for r in rows if r["verdict"] == "watermarked"] == ["42"]
    assert rows[-1]["verdict"] == "error" and rows[-1]["error"] == "the text is NULL"
    assert summary.by_verdict == {"error": 1, "not_detected": 199, "watermarked": 1}


def test_scan_rows_carry_window_fields(word_key, word_tokenizer_json, planted):
    config = _config(word_key, word_tokenizer_json)
    rng = np.random.default_rng(6)
    text_ = _human(rng, 600) + " " + _words(planted(word_key, 150, rng)) + " " + _human(rng, 600)
    (row,) = detect_batch(config.build(), ALPHA, (("src", "1", text_),))
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


def test_an_unreachable_dask_scheduler_is_an_input_error_and_leaves_no_output(
    word_key, word_tokenizer_json, tmp_path
):
    from wmark.scan.workers import DaskExecutor

    config = _config(word_key, word_tokenizer_json)
    with pytest.raises(InputError, match="cannot reach the scheduler"):
        DaskExecutor(config, "tcp://127.0.0.1:9", 1, connect_timeout=1)
    (tmp_path / "a.txt").write_text("w1 w2 w3", encoding="utf-8")
    with pytest.raises(InputError, match="--workers"):
        _scan(tmp_path / "a.txt", tmp_path / "out.jsonl", word_key, word_tokenizer_json, workers=-1)
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


@pytest.mark.parametrize(
    ("workers", "dask"),
    [(0, None), (1, None), (2, None), (2, "local")],
    ids=["inline", "pool-1", "pool-2", "dask"],
)
def test_an_invalid_document_is_one_error_row_with_every_executor(
    corpus, tmp_path, word_key, word_tokenizer_json, workers, dask
):
    # A JSON "\ud800" escape decodes to a str no tokenizer takes; it used to fail its whole batch.
    root, _ = corpus
    _scan(root, tmp_path / "reference.jsonl", word_key, word_tokenizer_json)
    rng = np.random.default_rng(5)
    lines = [json.dumps({"text": _human(rng)}) for _ in range(10)]
    lines[3] = '{"text": "w1 \\ud800 w2"}'
    (root / "bad.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    _scan(root, out, word_key, word_tokenizer_json, workers=workers, dask=dask, batch_docs=16)
    rows = _jsonl(out)
    bad = str(root / "bad.jsonl")
    errors = [(r["doc_id"], r["error"]) for r in rows if r["source"] == bad and r["verdict"] == "error"]
    assert errors == [("line:4", "not valid Unicode text (an unpaired surrogate at character 3)")]
    assert sum(r["source"] == bad for r in rows) == 10
    assert [r for r in rows if r["source"] != bad] == _jsonl(tmp_path / "reference.jsonl")


class _TokenizerRejects:
    """A localizer whose batch tokenisation fails on one text, as the tokenizer's does."""

    def __init__(self, localizer: Any) -> None:
        self.localizer = localizer

    def localize_many(self, texts: Sequence[str], *, alpha: float) -> list[Any]:
        if any("boom" in t for t in texts):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
        return list(self.localizer.localize_many(texts, alpha=alpha))


def test_a_document_that_fails_detection_is_its_own_error_row(word_key, word_tokenizer_json):
    config = _config(word_key, word_tokenizer_json)
    rng = np.random.default_rng(4)
    batch: Batch = tuple(("mem", f"row:{i}", "boom" if i == 2 else _human(rng)) for i in range(6))
    localizer = config.build()
    rows = detect_batch(_TokenizerRejects(localizer), ALPHA, batch)  # type: ignore[arg-type]
    assert [r.doc_id for r in rows] == [f"row:{i}" for i in range(6)]
    assert rows[2] == ScanRow.failed(
        "mem", "row:2", "detection failed (TypeError: TextEncodeInput must be Union[TextInputSequence, ...])"
    )
    good = [b for i, b in enumerate(batch) if i != 2]
    assert [r for i, r in enumerate(rows) if i != 2] == detect_batch(localizer, ALPHA, tuple(good))


class _PoisonedPool(PoolExecutor):
    """A real process pool whose worker process dies on the document "poison"."""

    def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
        if any(t == "poison" for _, _, t in batch):  # the worker that takes it ends at once,
            return self._pool.submit(os._exit, 1)  # as on a segfault or the OOM killer
        return super().submit(batch)


def test_a_document_that_kills_its_worker_is_one_error_row(tmp_path, word_key, word_tokenizer_json):
    rng = np.random.default_rng(8)
    docs = [Document("mem", f"row:{i}", _human(rng), None, 10) for i in range(24)]
    docs[9] = Document("mem", "row:9", "poison", None, 10)
    inline = Journal.open(tmp_path / "inline.jsonl", settings={})
    try:
        run_scan(
            iter(docs[:9] + docs[10:]),
            journal=inline,
            executor=InlineExecutor(_config(word_key, word_tokenizer_json)),
        )
    finally:
        inline.close()
    executor = _PoisonedPool(_config(word_key, word_tokenizer_json), 2)
    journal = Journal.open(tmp_path / "out.jsonl", settings={})
    try:
        run_scan(iter(docs), journal=journal, executor=executor, batch_docs=8)
    finally:
        journal.close()
        executor.close()
    rows = _jsonl(tmp_path / "out.jsonl")
    assert [(r["doc_id"], r["verdict"]) for r in rows if r["verdict"] == "error"] == [("row:9", "error")]
    assert "BrokenProcessPool" in rows[9]["error"]
    assert rows[:9] + rows[10:] == _jsonl(tmp_path / "inline.jsonl")
