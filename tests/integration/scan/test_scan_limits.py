"""Hostile stores: every document is bounded before it is read whole, and one bad document is one
error row while the rest of its file and the store are still scanned.

Bombs are built here from zeros and repeated lines (50 MB inflated, a few hundred KB on disk;
a 50 MB line) and read under a 1 MiB limit, so each test stays cheap; memory is measured with
tracemalloc (the decompressors' buffers are Python bytes, so it sees them).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gzip
import json
import lzma
import os
import socket
import threading
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wmark.errors import InputError
from wmark.scan.limits import ReadLimits
from wmark.scan.rows import ScanRow
from wmark.scan.scan import scan
from wmark.scan.sources import Document, FileSource, SourceOptions
from wmark.scan.workers import Batch, InlineExecutor, PoolExecutor

MiB = 1 << 20
LIMITS = ReadLimits(max_doc_bytes=MiB, max_ratio=200)
OPTIONS = SourceOptions(field="text", column="text", limits=LIMITS)
BOMB = 50 * MiB
CHUNK = b"\0" * MiB


def _docs(source: FileSource) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    return {(Path(d.source).name, d.doc_id): (d.text, d.error) for d in source.documents()}


def _zeros(fh: Any, n: int = BOMB) -> None:
    for _ in range(n // len(CHUNK)):
        fh.write(CHUNK)


def _line(text: str) -> bytes:
    return (json.dumps({"text": text}) + "\n").encode()


@pytest.fixture()
def bombs(tmp_path: Path) -> Path:
    """A folder of bombs, each next to good documents that must still be read."""
    root = tmp_path / "store"
    root.mkdir()
    (root / "good.txt").write_text("w1 w2 w3", encoding="utf-8")
    with gzip.open(root / "zeros.txt.gz", "wb", compresslevel=1) as fh:
        _zeros(fh)
    with (root / "long.jsonl").open("wb") as fh:
        fh.write(_line("first"))
        fh.write(b'{"text": "')
        for _ in range(BOMB // MiB):
            fh.write(b"w" * MiB)
        fh.write(b'"}\n')
        fh.write(_line("after the long line"))
    with zipfile.ZipFile(root / "archive.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("ok.txt", "w4 w5")
        with archive.open("zeros.txt", "w") as member:
            _zeros(member)
    with lzma.open(root / "many.jsonl.xz", "wb", preset=0) as fh:  # short lines, each within the limit
        for _ in range(80):  # 8 MB in 1.3 KB
            fh.write(_line("w1 " * 30) * 1000)
    return root


def test_bombs_are_one_error_row_each_and_memory_stays_bounded(bombs):
    tracemalloc.start()
    try:
        docs = {}  # the texts of many.jsonl.xz's 10,000 documents are not kept: not the reader's
        for d in FileSource([str(bombs)], OPTIONS).documents():
            docs[(Path(d.source).name, d.doc_id)] = (None if "many" in d.source else d.text, d.error)
        zipped = FileSource([f"zip://*::{bombs / 'archive.zip'}"], OPTIONS)
        members = {d.source.split("::")[0]: (d.text, d.error) for d in zipped.documents()}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * MiB, f"peak {peak / MiB:.1f} MiB while reading 50 MiB bombs under a 1 MiB limit"
    assert docs[("good.txt", "")] == ("w1 w2 w3", None)
    assert docs[("zeros.txt.gz", "")] == (
        None,
        "document over --max-doc-bytes (1 MiB) after decompression",
    )
    assert docs[("long.jsonl", "line:1")] == ("first", None)
    assert docs[("long.jsonl", "line:2")] == (None, "line over --max-doc-bytes (1 MiB)")
    assert docs[("long.jsonl", "line:3")] == ("after the long line", None)
    assert sum(source == "long.jsonl" for source, _ in docs) == 3
    many = [(doc_id, error) for (source, doc_id), (_, error) in docs.items() if source == "many.jsonl.xz"]
    assert len(many) > 1000  # the first MiB is read as usual, then the file stops once
    assert [error for _, error in many if error] == [
        f"read failed after {many[-2][0]} (the file inflates more than --max-ratio (200:1) past "
        "1 MiB: a compression bomb?)"
    ]
    assert members == {
        "zip://ok.txt": ("w4 w5", None),
        "zip://zeros.txt": (
            None,
            "document over --max-doc-bytes (1 MiB) after decompression (the archive says 52,428,800 bytes)",
        ),
    }


def test_a_zip_member_that_inflates_past_the_ratio_is_refused_unread(tmp_path):
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("z.jsonl", "w") as member:
        for _ in range(8):
            member.write(_line("w1 " * 30) * 10_000)
    docs = _docs(FileSource([f"zip://*::{path}"], OPTIONS))
    [(text, error)] = docs.values()
    assert text is None and error.startswith("the file inflates more than --max-ratio (200:1)")


def test_a_record_nested_too_deeply_is_one_error_row_and_later_records_are_read(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(_line("one") + b"[" * 100_000 + b"]" * 100_000 + b"\n" + _line("three"))
    docs = _docs(FileSource([str(path)], OPTIONS))
    assert docs == {
        ("deep.jsonl", "line:1"): ("one", None),
        ("deep.jsonl", "line:2"): (None, "invalid JSON (nested too deeply)"),
        ("deep.jsonl", "line:3"): ("three", None),
    }


def test_a_csv_record_over_the_limit_is_one_error_row_and_later_rows_are_read(tmp_path):
    path = tmp_path / "t.csv"
    with path.open("wb") as fh:
        fh.write(b"id,text\n1,first\n2,")
        fh.write(b"w" * (3 * MiB))
        fh.write(b'\n3,"third, quoted\nover two lines"\n4,fourth\n')
    docs = _docs(FileSource([str(path)], OPTIONS))
    assert docs == {
        ("t.csv", "row:0"): ("first", None),
        ("t.csv", "row:1"): (None, "row over --max-doc-bytes (1 MiB)"),
        ("t.csv", "row:2"): ("third, quoted\nover two lines", None),
        ("t.csv", "row:3"): ("fourth", None),
    }


def test_parquet_values_and_row_groups_over_the_limits(tmp_path):
    values = pa.table({"text": ["first", "w" * (2 * MiB), "third"]})
    pq.write_table(values, tmp_path / "values.parquet")
    bomb = pa.table({"text": ["first", "\0" * BOMB]})
    pq.write_table(bomb, tmp_path / "bomb.parquet", compression="zstd", use_dictionary=False)
    docs = _docs(FileSource([str(tmp_path)], OPTIONS))
    assert docs[("values.parquet", "row:0")] == ("first", None)
    assert docs[("values.parquet", "row:1")] == (None, "value over --max-doc-bytes (1 MiB)")
    assert docs[("values.parquet", "row:2")] == ("third", None)
    [(text, error)] = [v for (source, _), v in docs.items() if source == "bomb.parquet"]
    assert text is None and error.startswith(
        "parquet row group 0: the file inflates more than --max-ratio (200:1)"
    )


def test_zip_members_whose_names_leave_the_archive_are_counted_error_rows(tmp_path):
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ok.txt", "fine")
        archive.writestr("../../evil.txt", "evil")
        archive.writestr("/abs.txt", "absolute")
        archive.writestr("../x.png", "unknown format, still counted")
    refused = "a zip member whose name leaves the archive ({!r}), not read"
    for url in (f"zip://*::{path}", f"zip://::{path}"):
        docs = {
            (d.source.split("::")[0], d.doc_id): (d.text, d.error)
            for d in FileSource([url], OPTIONS).documents()
        }
        assert docs == {
            ("zip://ok.txt", ""): ("fine", None),
            ("zip://../../evil.txt", ""): (None, refused.format("../../evil.txt")),
            ("zip:///abs.txt", ""): (None, refused.format("/abs.txt")),
            ("zip://../x.png", ""): (None, refused.format("../x.png")),
        }, url
    only_txt = FileSource([f"zip://*.txt::{path}"], OPTIONS)
    assert sorted(d.error or d.text for d in only_txt.documents()) == [
        refused.format("../../evil.txt"),
        refused.format("/abs.txt"),
        "fine",
    ]


def _unblock(fifo: Path) -> None:
    """Open `fifo` for writing (and close it), so a reader stuck in open() gets its end of file."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _read_all(source: FileSource, fifo: Path) -> list[Document]:
    found: list[Document] = []
    reader = threading.Thread(target=lambda: found.extend(source.documents()), daemon=True)
    reader.start()
    reader.join(60)  # only a guard: reading two tiny files takes milliseconds
    stuck = reader.is_alive()
    while reader.is_alive():  # the old code blocked in open() on the FIFO: release it
        _unblock(fifo)
        reader.join(0.1)
    assert not stuck, "reading blocked on a FIFO"
    return found


def test_a_file_swapped_for_a_fifo_after_listing_is_an_error_row_not_a_hang(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    (root / "a.txt").write_text("w1 w2", encoding="utf-8")
    (root / "b.txt").write_text("w3 w4", encoding="utf-8")
    source = FileSource([str(root)], OPTIONS)
    (root / "a.txt").unlink()
    os.mkfifo(root / "a.txt")
    docs = {(Path(d.source).name, d.error or d.text) for d in _read_all(source, root / "a.txt")}
    assert docs == {("a.txt", "not a regular file (a FIFO), not read"), ("b.txt", "w3 w4")}


def test_fifos_and_sockets_are_error_rows_when_walked_or_named(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    (root / "good.txt").write_text("w1", encoding="utf-8")
    os.mkfifo(root / "pipe.txt")
    os.mkfifo(root / "pipe.bin")  # unknown format: skipped and counted, like any other file
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock.md"))
    try:
        walked = FileSource([str(root)], OPTIONS)
        docs = {(Path(d.source).name, d.error or d.text) for d in _read_all(walked, root / "pipe.txt")}
        named = FileSource([str(root / "pipe.txt")], OPTIONS)
        assert [d.error for d in _read_all(named, root / "pipe.txt")] == [
            "not a regular file (a FIFO), not read"
        ]
        globbed = FileSource([str(root / "*.txt")], OPTIONS)
        assert len(_read_all(globbed, root / "pipe.txt")) == 2
    finally:
        server.close()
    assert docs == {
        ("good.txt", "w1"),
        ("pipe.txt", "not a regular file (a FIFO), not read"),
        ("sock.md", "not a regular file (a socket), not read"),
    }
    assert [Path(p).name for p in walked.skipped] == ["pipe.bin"]


def test_a_sql_text_over_the_limit_is_an_error_row_and_never_reaches_a_worker(tmp_path, scans):
    docs = [Document("sql", str(i), "w1 w2 w3", None, 0) for i in range(4)]
    docs[1] = Document("sql", "1", "w1 " * 400_000, None, 0)  # 1.2 MB
    docs[2] = Document("sql", "2", "é" * 600_000, None, 0)  # 600,000 characters, 1.2 MB of UTF-8
    sent: list[Batch] = []

    class Recording(InlineExecutor):
        def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
            sent.append(batch)
            return super().submit(batch)

    _, rows = scans.journal(docs, Recording(scans.config), tmp_path / "o.jsonl", limits=LIMITS)
    assert [(r["doc_id"], r["error"]) for r in rows] == [
        ("0", None),
        ("1", "text over --max-doc-bytes (1 MiB)"),
        ("2", "text over --max-doc-bytes (1 MiB)"),
        ("3", None),
    ]
    assert [doc_id for batch in sent for _, doc_id, _ in batch] == ["0", "3"]


class _AbortingPool(PoolExecutor):
    """A real process pool whose worker aborts on the document "poison", as the tokenizer's
    Rust code does when a memory allocation fails."""

    def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
        if any(t == "poison" for _, _, t in batch):
            return self._pool.submit(os.abort)  # SIGABRT; a function of the stdlib: workers import it
        return super().submit(batch)


def test_a_worker_that_dies_leaves_a_row_saying_how(tmp_path, scans):
    rng = np.random.default_rng(9)
    docs = [
        Document("mem", f"row:{i}", " ".join(f"w{j}" for j in rng.integers(0, 500, 50)), None, 1)
        for i in range(6)
    ]
    docs[3] = Document("mem", "row:3", "poison", None, 1)
    _, rows = scans.journal(docs, _AbortingPool(scans.config, 1), tmp_path / "o.jsonl", batch_docs=4)
    errors = [(r["doc_id"], r["error"]) for r in rows if r["verdict"] == "error"]
    assert len(errors) == 1 and errors[0][0] == "row:3"
    assert errors[0][1].startswith(
        "worker failed (a worker process was killed by SIGABRT (a failed memory allocation?); "
        "BrokenProcessPool: "
    ), errors[0][1]


def test_a_scan_with_bombs_writes_one_row_each_and_pins_its_limits(
    bombs, tmp_path, word_key, word_tokenizer_json
):
    out = tmp_path / "out.jsonl"
    kw: dict[str, Any] = {
        "urls": [str(bombs)],
        "keys": [word_key],
        "tokenizers": {word_key.spec.tokenizer.sha256: word_tokenizer_json},
        "out": out,
        "workers": 0,
    }
    (bombs / "many.jsonl.xz").unlink()  # its many rows are the reader's test above
    summary = scan(options=OPTIONS, **kw)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    errors = {(Path(r["source"]).name, r["doc_id"]): r["error"] for r in rows if r["verdict"] == "error"}
    assert errors == {
        ("zeros.txt.gz", ""): "document over --max-doc-bytes (1 MiB) after decompression",
        ("long.jsonl", "line:2"): "line over --max-doc-bytes (1 MiB)",
    }
    assert summary.documents == 5 and summary.by_verdict["error"] == 2  # the .zip is not walked into
    manifest = json.loads(out.with_name("out.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert manifest["settings"]["max_doc_bytes"] == MiB
    other = SourceOptions(field="text", column="text", limits=ReadLimits(max_doc_bytes=2 * MiB))
    with pytest.raises(InputError, match="settings"):
        scan(options=other, resume=True, **kw)


@pytest.mark.parametrize(("doc", "ratio"), [(0, 1), (1, 0), (2**30 + 1, 1)])
def test_limits_must_be_positive_and_a_document_at_most_1_gib(doc, ratio):
    with pytest.raises(InputError, match="must be >= 1|must be between 1 and 1073741824"):
        ReadLimits(doc, ratio)
