"""Scan sources on real files of every format, and fsspec stores (memory://, file://, zip://, a
local HTTP server) standing in for object storage. SQL tables: test_sql_source.py."""

from __future__ import annotations

import gzip
import http.server
import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wmark.errors import InputError
from wmark.scan.formats import visible_text
from wmark.scan.sources import FileSource, SourceOptions

HTML = """<!doctype html><html><head><title>Not shown</title><style>p {color: red}</style>
<script>var shown = false;</script></head>
<body><h1>Report</h1><p>First   paragraph &amp; more
text.</p><div hidden><p>hidden</p><div>still hidden</div></div><p>Caf&eacute; <b>bold</b></p>
<pre>keep   this
  spacing</pre><noscript>no script</noscript><ul><li>one</li><li>two</li></ul></body></html>"""


def _docs(source) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    return {(d.source, d.doc_id): (d.text, d.error) for d in source.documents()}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    """A folder tree with one or more files of every format, good and bad."""
    root = tmp_path / "store"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("plain text document\n", encoding="utf-8")
    (root / "sub" / "b.md").write_text("# Title\n\nSome *markdown*.\n", encoding="utf-8")
    (root / "c.html").write_text(HTML, encoding="utf-8")
    (root / "d.jsonl").write_text(
        '{"text": "first record", "id": 1}\n'
        "\n"
        "{not json}\n"
        '{"body": "no text field"}\n'
        '{"text": 42}\n'
        '{"text": "last record"}\n',
        encoding="utf-8",
    )
    (root / "e.csv").write_text('id,text\n1,"a, quoted\nmultiline text"\n2\n3,plain\n', encoding="utf-8")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["row zero", None, "row two"]}), root / "f.parquet")
    (root / "g.jsonl.gz").write_bytes(gzip.compress(b'{"text": "compressed"}\n' * 3))
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "picture.png").write_bytes(b"\x89PNG\r\n")
    (root / ".hidden.txt").write_text("hidden file", encoding="utf-8")
    return root


OPTIONS = SourceOptions(field="text", column="text")


def test_every_format_from_a_folder_tree(store):
    source = FileSource([str(store)], OPTIONS)
    docs = _docs(source)
    s = str(store)
    assert docs[(f"{s}/a.txt", "")] == ("plain text document\n", None)
    assert docs[(f"{s}/sub/b.md", "")] == ("# Title\n\nSome *markdown*.\n", None)
    assert docs[(f"{s}/c.html", "")][0] == visible_text(HTML)
    assert docs[(f"{s}/d.jsonl", "line:1")] == ("first record", None)
    assert docs[(f"{s}/d.jsonl", "line:6")] == ("last record", None)
    assert "invalid JSON" in docs[(f"{s}/d.jsonl", "line:3")][1]
    assert "no field 'text'" in docs[(f"{s}/d.jsonl", "line:4")][1]
    assert "not text (int)" in docs[(f"{s}/d.jsonl", "line:5")][1]
    assert (f"{s}/d.jsonl", "line:2") not in docs  # blank lines are not documents
    assert docs[(f"{s}/e.csv", "row:0")] == ("a, quoted\nmultiline text", None)
    assert "1 fields" in docs[(f"{s}/e.csv", "row:1")][1]
    assert docs[(f"{s}/e.csv", "row:2")] == ("plain", None)
    assert docs[(f"{s}/f.parquet", "row:0")] == ("row zero", None)
    assert "is null" in docs[(f"{s}/f.parquet", "row:1")][1]
    assert docs[(f"{s}/f.parquet", "row:2")] == ("row two", None)
    assert [docs[(f"{s}/g.jsonl.gz", f"line:{i}")][0] for i in (1, 2, 3)] == ["compressed"] * 3
    assert "not UTF-8" in docs[(f"{s}/latin1.txt", "")][1]
    assert "not a readable parquet file" in docs[(f"{s}/corrupt.parquet", "")][1]
    assert docs[(f"{s}/empty.txt", "")] == ("", None)  # empty text becomes an error row in the scan
    assert source.skipped == [f"{s}/picture.png"]
    assert not any(".hidden" in src for src, _ in docs)
    assert [d.source for d in source.documents()] == sorted(d.source for d in source.documents())


def test_html_visible_text_drops_scripts_styles_head_and_hidden_elements():
    shown = visible_text(HTML)
    assert shown.split("\n\n") == [
        "Report",
        "First paragraph & more text.",
        "Café bold",
        "keep   this\n  spacing",
        "one\ntwo",
    ]
    for absent in ("Not shown", "color", "shown = false", "hidden", "no script"):
        assert absent not in shown


def test_html_in_a_declared_legacy_charset_is_decoded(tmp_path):
    page = tmp_path / "old.html"
    page.write_bytes(
        '<html><head><meta charset="iso-8859-1"></head><body><p>caf\xe9</p></body></html>'.encode("latin-1")
    )
    assert _docs(FileSource([str(page)], SourceOptions())) == {(str(page), ""): ("café", None)}


def test_document_sizes_add_up_to_the_file_sizes(store):
    source = FileSource([str(store)], OPTIONS)
    per_file: dict[str, int] = {}
    for d in source.documents():
        per_file[d.source] = per_file.get(d.source, 0) + d.nbytes
    for f in source.files:
        assert per_file[f.label] == os.path.getsize(f.label), f.label
    assert source.total_bytes == sum(per_file.values())


def test_format_override_globs_and_explicit_files(store, tmp_path):
    log = tmp_path / "notes.log"
    log.write_text("a log file read as text", encoding="utf-8")
    with pytest.raises(InputError, match="unknown format"):
        FileSource([str(log)], SourceOptions())
    assert _docs(FileSource([str(log)], SourceOptions(format="txt"))) == {
        (str(log), ""): ("a log file read as text", None)
    }
    globbed = FileSource([f"{store}/**/*.md", f"{store}/*.txt"], SourceOptions())
    assert [f.label for f in globbed.files] == [
        f"{store}/a.txt",
        f"{store}/empty.txt",
        f"{store}/latin1.txt",
        f"{store}/sub/b.md",
    ]
    with pytest.raises(InputError, match="unknown format"):
        SourceOptions(format="docx")


def test_jsonl_csv_and_parquet_need_their_field_or_column(store):
    with pytest.raises(InputError, match="--field"):
        FileSource([str(store)], SourceOptions(column="text"))
    with pytest.raises(InputError, match="--column"):
        FileSource([str(store)], SourceOptions(field="text"))
    csv = store / "e.csv"
    docs = _docs(FileSource([str(csv)], SourceOptions(field="body")))
    assert "no column 'body'" in docs[(str(csv), "")][1]


def test_missing_paths_unknown_protocols_and_missing_drivers_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        FileSource([str(tmp_path / "nope")], OPTIONS)
    with pytest.raises(InputError, match="Protocol not known"):
        FileSource(["nosuch://bucket/x"], OPTIONS)
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="s3fs"):
            FileSource(["s3://bucket/prefix/"], OPTIONS)


def test_the_scans_own_output_is_never_read(store):
    (store / "results.jsonl").write_text('{"text": "an output row"}\n', encoding="utf-8")
    source = FileSource([str(store)], OPTIONS, exclude=[str(store / "results.jsonl")])
    assert f"{store}/results.jsonl" not in {f.label for f in source.files}


@pytest.fixture()
def memory_bucket() -> Iterator[str]:
    fs = fsspec.filesystem("memory")
    root = "/wmark-test-bucket"
    fs.pipe(
        {
            f"{root}/submissions/a.txt": b"memory text",
            f"{root}/submissions/b.jsonl": b'{"text": "one"}\n{"text": "two"}\n',
            f"{root}/submissions/deep/c.md": b"deep markdown",
            f"{root}/other/x.txt": b"not listed",
        }
    )
    try:
        yield root
    finally:
        fs.rm(root, recursive=True)


def test_memory_store_stands_in_for_object_storage(memory_bucket):
    docs = _docs(FileSource([f"memory://{memory_bucket}/submissions"], OPTIONS))
    base = f"memory://{memory_bucket}/submissions"
    assert docs == {
        (f"{base}/a.txt", ""): ("memory text", None),
        (f"{base}/b.jsonl", "line:1"): ("one", None),
        (f"{base}/b.jsonl", "line:2"): ("two", None),
        (f"{base}/deep/c.md", ""): ("deep markdown", None),
    }
    globbed = FileSource([f"memory://{memory_bucket}/*/*.txt"], OPTIONS)
    assert [f.label for f in globbed.files] == [f"memory://{memory_bucket}/other/x.txt", f"{base}/a.txt"]


def test_file_url_of_a_local_directory(store):
    docs = _docs(FileSource([f"file://{store}/sub"], OPTIONS))
    assert docs == {(f"{store}/sub/b.md", ""): ("# Title\n\nSome *markdown*.\n", None)}


def test_zip_archive(store, tmp_path, monkeypatch):
    archive = tmp_path / "archive.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(store / "a.txt", "docs/a.txt")
        z.write(store / "d.jsonl", "docs/d.jsonl")
        z.write(store / "picture.png", "docs/picture.png")
    whole = FileSource([f"zip://::{archive}"], OPTIONS)
    docs = _docs(whole)
    assert docs[(f"zip://docs/a.txt::{archive}", "")] == ("plain text document\n", None)
    assert docs[(f"zip://docs/d.jsonl::{archive}", "line:6")] == ("last record", None)
    assert whole.skipped == [f"zip://docs/picture.png::{archive}"]
    monkeypatch.chdir(tmp_path)  # a relative archive path gets the same, absolute, identity
    relative = FileSource(["zip://docs/*.txt::archive.zip"], OPTIONS)
    assert [f.label for f in relative.files] == [f"zip://docs/a.txt::{archive}"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass


@pytest.fixture()
def http_root(store) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: _QuietHandler(*a, directory=str(store.parent), **kw)
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_http_server_directory_listing_and_single_file(http_root, store):
    single = _docs(FileSource([f"{http_root}/store/a.txt"], OPTIONS))
    assert single == {(f"{http_root}/store/a.txt", ""): ("plain text document\n", None)}
    walked = FileSource([f"{http_root}/store/"], OPTIONS)
    docs = _docs(walked)
    assert docs[(f"{http_root}/store/d.jsonl", "line:1")] == ("first record", None)
    assert docs[(f"{http_root}/store/sub/b.md", "")] == ("# Title\n\nSome *markdown*.\n", None)
    with pytest.raises(InputError, match="no such file"):
        FileSource([f"{http_root}/store/missing.txt"], OPTIONS)
    (store / "links.html").write_text('<p>see <a href="a.txt">this</a></p>', encoding="utf-8")
    page = _docs(FileSource([f"{http_root}/store/links.html"], OPTIONS))  # a page, not a listing
    assert page == {(f"{http_root}/store/links.html", ""): ("see this", None)}


def test_permission_denied_files_and_folders_become_error_documents(store):
    """Root reads anything, so as root the listing runs without the capabilities that bypass
    file permissions (setpriv), like an ordinary user."""
    (store / "locked.txt").write_text("secret", encoding="utf-8")
    (store / "locked.txt").chmod(0)
    (store / "closed").mkdir()
    (store / "closed" / "x.txt").write_text("inside", encoding="utf-8")
    (store / "closed").chmod(0)
    script = (
        "import json, sys\n"
        "from wmark.scan.sources import FileSource, SourceOptions\n"
        "src = FileSource([sys.argv[1]], SourceOptions(field='text', column='text'))\n"
        "print(json.dumps([[d.source, d.doc_id, d.error] for d in src.documents()]))\n"
    )
    command = [sys.executable, "-c", script, str(store)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file permissions cannot be enforced")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    try:
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    finally:
        (store / "closed").chmod(0o755)
    errors = {(src, doc_id): err for src, doc_id, err in json.loads(out.stdout)}
    assert errors[(f"{store}/locked.txt", "")] == "cannot read (Permission denied)"
    assert errors[(f"{store}/closed", "")] == "cannot list directory (Permission denied)"
    assert errors[(f"{store}/a.txt", "")] is None  # the rest is read as usual


def test_corrupt_compressed_files_are_one_error_document_each(tmp_path):
    rng = np.random.default_rng(11)
    root = tmp_path / "d"
    root.mkdir()
    for name in ("x.md.xz", "y.txt.gz", "z.txt.bz2", "w.txt.lzma"):
        (root / name).write_bytes(rng.bytes(500))  # not an archive at all
    packed = bytearray(gzip.compress(b"w1 w2 w3 " * 2000))
    packed[12] ^= 0xFF  # a damaged deflate block in a real archive: zlib.error, not an OSError
    (root / "damaged.txt.gz").write_bytes(bytes(packed))
    (root / "good.txt.xz").write_bytes(lzma.compress(b"still read"))
    docs = _docs(FileSource([str(root)], OPTIONS))
    assert docs.pop((str(root / "good.txt.xz"), "")) == ("still read", None)
    assert sorted(Path(source).name for source, _ in docs) == sorted(
        ["x.md.xz", "y.txt.gz", "z.txt.bz2", "w.txt.lzma", "damaged.txt.gz"]
    )
    assert all(text is None and error for text, error in docs.values())
    assert "LZMAError" in docs[(str(root / "x.md.xz"), "")][1]
    assert docs[(str(root / "damaged.txt.gz"), "")] == (
        None,
        "read failed at the start (zlib.error: Error -3 while decompressing data: invalid code lengths set)",
    )


def test_a_corrupt_member_of_a_zip_archive_is_an_error_document(tmp_path):
    archive = tmp_path / "archive.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("docs/a.txt", "a good member")
        z.writestr("docs/b.txt", "a member whose bytes are changed")
    data = archive.read_bytes()
    archive.write_bytes(data.replace(b"whose bytes", b"WHOSE bytes"))  # its CRC no longer matches
    docs = _docs(FileSource([f"zip://::{archive}"], OPTIONS))
    assert docs[(f"zip://docs/a.txt::{archive}", "")] == ("a good member", None)
    text, error = docs[(f"zip://docs/b.txt::{archive}", "")]
    assert text is None and error is not None and "BadZipFile" in error


def test_dangling_links_are_error_documents(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("inside", encoding="utf-8")
    (root / "gone.txt").symlink_to(root / "deleted.txt")  # its target never existed
    missing = "a symbolic link to a missing file, not read"
    for url in (str(root), str(root / "*.txt")):
        for options in (OPTIONS, SourceOptions(follow_links=True)):
            docs = _docs(FileSource([url], options))
            assert docs == {
                (str(root / "a.txt"), ""): ("inside", None),
                (str(root / "gone.txt"), ""): (None, missing),
            }, (url, options.follow_links)


def test_links_out_of_the_tree_are_error_documents_unless_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text("secret", encoding="utf-8")
    (outside / "sub" / "more.txt").write_text("more", encoding="utf-8")
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("inside", encoding="utf-8")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "alias.txt").symlink_to(root / "a.txt")  # a link inside the tree is read
    (root / "linked").symlink_to(outside / "sub", target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)  # followed, it must not walk forever
    refused = "a symbolic link out of the scanned folder, not followed (--follow-links reads it)"
    for url in (str(root), str(root / "*.txt")):
        docs = _docs(FileSource([url], OPTIONS))
        assert docs == {
            (str(root / "a.txt"), ""): ("inside", None),
            (str(root / "alias.txt"), ""): ("inside", None),
            (str(root / "link.txt"), ""): (None, refused),
        }, url
    followed = _docs(FileSource([str(root)], SourceOptions(follow_links=True)))
    assert {Path(s).name: t for (s, _), (t, _) in followed.items()} == {
        "a.txt": "inside",
        "alias.txt": "inside",
        "link.txt": "secret",
        "more.txt": "more",
    }
