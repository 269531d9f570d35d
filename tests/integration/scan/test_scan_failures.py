"""Scans whose workers fail: a batch that fails is run again alone and split until the document
that fails it is alone; a pool that breaks is restarted; a worker killed (or killed by one
document) loses nothing; a document no tokenizer takes is one error row on every executor.

The store and the key's helpers are `conftest.py`'s `corpus` and `scans`.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from wmark.scan.rows import ScanRow
from wmark.scan.sources import Document
from wmark.scan.workers import Batch, InlineExecutor, PoolExecutor, WorkerConfig, _deaths, detect_batch


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


def test_failed_batches_run_again_alone_and_split_until_the_failing_document_is_alone(tmp_path, scans):
    rng = np.random.default_rng(3)
    docs = [Document("mem", f"row:{i}", scans.human(rng), None, 10) for i in range(20)]
    docs[13] = Document("mem", "row:13", "poison", None, 10)
    executor = _FlakyExecutor(scans.config)
    summary, rows = scans.journal(docs, executor, tmp_path / "out.jsonl", batch_docs=5)
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


def test_a_pool_that_refuses_new_work_is_restarted_and_nothing_is_lost(tmp_path, scans):
    """Submitting to a pool whose worker was killed between two collects raises at once (no
    future to fail): the scan restarts the pool and runs the refused batch again, as it does
    the batches the pool held (the race that a killed worker in a real pool can hit)."""
    rng = np.random.default_rng(4)
    docs = [Document("mem", f"row:{i}", scans.human(rng), None, 10) for i in range(20)]
    executor = _BreakingExecutor(scans.config, healthy=2)
    summary, rows = scans.journal(docs, executor, tmp_path / "out.jsonl", batch_docs=5)
    assert [r["doc_id"] for r in rows] == [f"row:{i}" for i in range(20)]
    assert summary.by_verdict == {"not_detected": 20}
    assert executor.restarts == 1


def test_a_killed_pool_worker_is_replaced_and_nothing_is_lost(corpus, tmp_path, scans):
    root, _ = corpus
    scans.run(root, tmp_path / "inline.jsonl")
    killed: list[int] = []

    def kill_a_worker(progress):
        if not killed and progress.documents >= 20:
            children = multiprocessing.active_children()
            assert children, "the pool has no processes"
            killed.append(children[0].pid)
            os.kill(children[0].pid, signal.SIGKILL)

    scans.run(root, tmp_path / "pool.jsonl", workers=2, batch_docs=4, on_progress=kill_a_worker)
    assert killed
    assert (tmp_path / "pool.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("workers", "dask"),
    [(0, None), (1, None), (2, None), (2, "local")],
    ids=["inline", "pool-1", "pool-2", "dask"],
)
def test_an_invalid_document_is_one_error_row_with_every_executor(corpus, tmp_path, scans, workers, dask):
    # A JSON "\ud800" escape decodes to a str no tokenizer takes; it used to fail its whole batch.
    root, _ = corpus
    scans.run(root, tmp_path / "reference.jsonl")
    rng = np.random.default_rng(5)
    lines = [json.dumps({"text": scans.human(rng)}) for _ in range(10)]
    lines[3] = '{"text": "w1 \\ud800 w2"}'
    (root / "bad.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    scans.run(root, out, workers=workers, dask=dask, batch_docs=16)
    rows = scans.jsonl(out)
    bad = str(root / "bad.jsonl")
    errors = [(r["doc_id"], r["error"]) for r in rows if r["source"] == bad and r["verdict"] == "error"]
    assert errors == [("line:4", "not valid Unicode text (an unpaired surrogate at character 3)")]
    assert sum(r["source"] == bad for r in rows) == 10
    assert [r for r in rows if r["source"] != bad] == scans.jsonl(tmp_path / "reference.jsonl")


class _TokenizerRejects:
    """A localizer whose batch tokenisation fails on one text, as the tokenizer's does."""

    def __init__(self, localizer: Any) -> None:
        self.localizer = localizer

    def localize_many(self, texts: Sequence[str], *, alpha: float) -> list[Any]:
        if any("boom" in t for t in texts):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
        return list(self.localizer.localize_many(texts, alpha=alpha))


def test_a_document_that_fails_detection_is_its_own_error_row(scans):
    config = scans.config
    rng = np.random.default_rng(4)
    batch: Batch = tuple(("mem", f"row:{i}", "boom" if i == 2 else scans.human(rng)) for i in range(6))
    localizer = config.build()
    rows = detect_batch(_TokenizerRejects(localizer), scans.alpha, batch)  # type: ignore[arg-type]
    assert [r.doc_id for r in rows] == [f"row:{i}" for i in range(6)]
    assert rows[2] == ScanRow.failed(
        "mem", "row:2", "detection failed (TypeError: TextEncodeInput must be Union[TextInputSequence, ...])"
    )
    good = [b for i, b in enumerate(batch) if i != 2]
    assert [r for i, r in enumerate(rows) if i != 2] == detect_batch(localizer, scans.alpha, tuple(good))


class _PoisonedPool(PoolExecutor):
    """A real process pool whose worker process dies on the document "poison"."""

    def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
        if any(t == "poison" for _, _, t in batch):  # the worker that takes it ends at once,
            return self._pool.submit(os._exit, 1)  # as on a segfault or the OOM killer
        return super().submit(batch)


def test_a_document_that_kills_its_worker_is_one_error_row(tmp_path, scans):
    rng = np.random.default_rng(8)
    docs = [Document("mem", f"row:{i}", scans.human(rng), None, 10) for i in range(24)]
    docs[9] = Document("mem", "row:9", "poison", None, 10)
    _, inline = scans.journal(docs[:9] + docs[10:], InlineExecutor(scans.config), tmp_path / "inline.jsonl")
    _, rows = scans.journal(docs, _PoisonedPool(scans.config, 2), tmp_path / "out.jsonl", batch_docs=8)
    assert [(r["doc_id"], r["verdict"]) for r in rows if r["verdict"] == "error"] == [("row:9", "error")]
    assert "BrokenProcessPool" in rows[9]["error"]
    assert rows[:9] + rows[10:] == inline


def test_how_a_worker_died_is_read_after_the_pool_has_reaped_it():
    """A broken pool fails its futures before its manager thread ends and joins the workers; a
    status read beside that join raced it (CI: "exited with code 255" for a SIGABRT). `_deaths`
    waits for the manager, here a thread that reaps a worker 0.3 s late."""

    class Worker:
        exitcode: int | None = None

    worker = Worker()

    def reap() -> None:
        time.sleep(0.3)
        worker.exitcode = -signal.SIGABRT

    manager = threading.Thread(target=reap)
    pool = SimpleNamespace(_processes={1: worker}, _executor_manager_thread=manager)
    manager.start()
    assert _deaths(pool) == "a worker process was killed by SIGABRT (a failed memory allocation?)"
