"""Crash-safe scan output: rows appended in committed chunks, and a manifest replaced atomically.

Commit protocol, safe against SIGKILL or power loss at any instant:

1. rows are appended to the data file (the output itself for .jsonl and .csv, a JSONL spool
   beside a .parquet output), flushed and fsynced;
2. then the manifest `OUT.manifest.json` is written to a temporary file, fsynced and renamed
   over the old one (and the directory fsynced). It records the scan's settings and how many
   bytes and rows of the data file are committed.

The committed prefix of the data file is the record of finished documents: `--resume`
truncates the file to that length (dropping a chunk whose manifest never landed), reads the
identities back, and the scan skips them, so every document ends up in the output exactly
once. Parquet is written from the spool when the scan completes (temporary file + rename), and
the spool is removed. A lock file keeps two scans from writing one output.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from wmark.errors import InputError
from wmark.scan.rows import COLUMNS, RECEIPT_COLUMNS, ScanRow, ScanSummary, Tally

try:  # POSIX; elsewhere two scans on one output are not prevented
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["OUTPUT_FORMATS", "Journal", "output_format"]

MANIFEST_VERSION = 1
OUTPUT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
_INT_COLUMNS = frozenset(
    {"n_tokens", "n_scored", "window_start", "window_end", "window_start_char", "window_end_char",
     "window_n_scored", "n_windows"}
)  # fmt: skip
_FLOAT_COLUMNS = frozenset({"p_value", "log_p", "whole_p_value", "window_p_value", "window_p_raw"})


def output_format(path: Path) -> str:
    """jsonl, csv or parquet, from the output's extension."""
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"--out {path}: the extension must be one of {', '.join(OUTPUT_FORMATS)}")
    return fmt


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Journal:
    """The output of one scan and its manifest; reopened by `--resume`.

    Build with `Journal.open`. `add` buffers rows, `commit` makes them durable, `finish` writes
    the final output and marks the scan complete.

    Attributes:
        out: the output file.
        format: jsonl, csv or parquet.
        columns: the rows' columns: `COLUMNS`, and "receipt" when the settings ask for receipts.
        done: identities (source, doc_id) of the documents already in the output.
        tally: counts over the committed rows.
        resumed: rows committed before this run.
        complete: the scan already finished (a `--resume` of a finished scan).
        summary: the stored summary of a finished scan.
    """

    def __init__(self, out: Path, settings: Mapping[str, Any]) -> None:
        self.out = out
        self.format = output_format(out)
        self.settings = json.loads(json.dumps(dict(settings), sort_keys=True))
        self.columns = RECEIPT_COLUMNS if self.settings.get("receipts") else COLUMNS
        self.manifest_path = out.with_name(out.name + ".manifest.json")
        self.data_path = out.with_name(out.name + ".spool.jsonl") if self.format == "parquet" else out
        self.lock_path = out.with_name(out.name + ".lock")
        self.done: set[tuple[str, str]] = set()
        self.tally = Tally()
        self.resumed = 0
        self.complete = False
        self.summary: dict[str, Any] | None = None
        self._committed_bytes = 0
        self._committed_rows = 0
        self._buffer = io.BytesIO()
        self._buffered_rows = 0
        self._lock: IO[bytes] | None = None
        self._data: IO[bytes] | None = None

    @classmethod
    def open(
        cls, out: Path, *, settings: Mapping[str, Any], resume: bool = False, overwrite: bool = False
    ) -> Journal:
        """Start a new output, or reopen one to resume it.

        Args:
            out: the output path (.jsonl, .ndjson, .csv or .parquet), local.
            settings: what decides the results (sources, keys, alpha, windows...); a resume
                must be given the same.
            resume: continue the scan recorded beside `out`.
            overwrite: start again, deleting a previous output.

        Raises:
            InputError: an existing output without --resume/--overwrite, a resume with other
                settings, an output changed outside wmark, a scan already writing it, or a
                place that cannot be written.
        """
        journal = cls(out.expanduser().absolute(), settings)
        try:
            journal._acquire()
            if resume and journal.manifest_path.exists():
                journal._reopen()
            else:
                journal._start(overwrite=overwrite, resume=resume)
        except OSError as exc:
            journal.close()
            raise InputError(f"--out {journal.out}: cannot write there ({exc.strerror or exc})") from exc
        except BaseException:
            journal.close()
            raise
        return journal

    def _acquire(self) -> None:
        if not self.out.parent.is_dir():
            raise InputError(f"--out {self.out}: the directory {self.out.parent} does not exist")
        self._lock = open(self.lock_path, "ab")  # noqa: SIM115  # held until close()
        if fcntl is not None:
            try:
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise InputError(f"another scan is writing {self.out}") from exc

    def _start(self, *, overwrite: bool, resume: bool) -> None:
        existing = [p for p in dict.fromkeys((self.out, self.data_path, self.manifest_path)) if p.exists()]
        if existing and not overwrite:
            if resume:
                raise InputError(
                    f"{self.out} exists but has no manifest, so it cannot be resumed; --overwrite"
                )
            raise InputError(f"{self.out} exists: --resume to continue that scan, --overwrite to start again")
        self._write_manifest()  # first, so that a crash from here on always leaves a manifest
        for path in existing:
            if path != self.manifest_path:
                path.unlink()
        self._data = open(self.data_path, "w+b")  # noqa: SIM115  # held until close()

    def _reopen(self) -> None:
        try:
            self._resume_from(json.loads(self.manifest_path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # edited by hand, cut short
            raise InputError(
                f"{self.manifest_path} or its data file is damaged: --overwrite to start the scan again"
            ) from None

    def _resume_from(self, manifest: Any) -> None:
        if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
            raise InputError(f"{self.manifest_path}: not a manifest this version of wmark can resume")
        if manifest["settings"] != self.settings:
            changed = sorted(
                k
                for k in set(manifest["settings"]) | set(self.settings)
                if manifest["settings"].get(k) != self.settings.get(k)
            )
            raise InputError(f"--resume: {self.out} was started with other settings ({', '.join(changed)})")
        self._committed_bytes = int(manifest["committed_bytes"])
        self._committed_rows = int(manifest["committed_rows"])
        self.complete = bool(manifest["complete"])
        self.summary = manifest.get("summary")
        if self.complete:
            return
        if not self.data_path.exists() and self._committed_bytes == 0:
            self.data_path.touch()
        size = self.data_path.stat().st_size if self.data_path.exists() else -1
        if size < self._committed_bytes:
            raise InputError(
                f"{self.data_path} is shorter than its manifest records: it was changed outside wmark"
            )
        self._data = open(self.data_path, "r+b")  # noqa: SIM115  # held until close()
        self._data.truncate(self._committed_bytes)  # drop a chunk whose commit never finished
        self._data.flush()
        os.fsync(self._data.fileno())
        rows = 0
        for row in self._read_committed():
            self.done.add((str(row["source"]), str(row["doc_id"])))
            self.tally.add([row])
            rows += 1
        if rows != self._committed_rows:
            raise InputError(f"{self.data_path} holds {rows} rows, its manifest {self._committed_rows}")
        self.resumed = rows
        self._data.seek(0, os.SEEK_END)

    def _read_committed(self) -> Iterator[dict[str, Any]]:
        # Called once the data file holds exactly the committed rows (after the truncation of a
        # resume, or the last commit), so it streams the whole file.
        if self.format == "csv":
            with open(self.data_path, encoding="utf-8", newline="") as text:
                yield from csv.DictReader(text)
        else:
            with open(self.data_path, "rb") as f:
                for line in f:
                    yield json.loads(line)

    def add(self, rows: Sequence[ScanRow]) -> None:
        """Buffer rows (written and made durable by the next `commit`): all of them, or none
        where one cannot be written, so that the buffer and its row count agree."""
        values = [{k: _utf8(v) for k, v in row.to_dict(self.columns).items()} for row in rows]
        if self.format == "csv":
            text = io.StringIO(newline="")
            writer = csv.writer(text, lineterminator="\n")
            # a bare \r is no line end to a writer ending lines with \n, so it would not quote the
            # field, and every reader would split the row there: such a row is quoted whole
            quoted = csv.writer(text, lineterminator="\n", quoting=csv.QUOTE_ALL)
            if self._committed_bytes == 0 and self._buffered_rows == 0 and self._buffer.tell() == 0:
                writer.writerow(self.columns)
            for row in values:
                cells = ["" if v is None else v for v in row.values()]
                (quoted if any(isinstance(v, str) and "\r" in v for v in cells) else writer).writerow(cells)
            data = text.getvalue().encode("utf-8")
        else:
            data = b"".join(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n" for row in values)
        self._buffer.write(data)
        self._buffered_rows += len(rows)
        self.tally.add(row.to_dict() for row in rows)

    @property
    def pending_rows(self) -> int:
        """Rows added since the last commit."""
        return self._buffered_rows

    def commit(self) -> None:
        """Append the buffered rows durably, then record them in the manifest."""
        if self._buffer.tell() == 0:
            return
        assert self._data is not None
        # from the last committed byte, not the end: a retry after a failed write or fsync
        # rewrites the same rows instead of appending them a second time
        self._data.seek(self._committed_bytes)
        self._data.write(self._buffer.getvalue())
        self._data.truncate()
        self._data.flush()
        os.fsync(self._data.fileno())
        self._committed_bytes = self._data.tell()
        self._committed_rows += self._buffered_rows
        self._buffer = io.BytesIO()
        self._buffered_rows = 0
        self._write_manifest()

    def finish(self, summary: ScanSummary) -> None:
        """Commit, write the final output (Parquet from the spool), and mark the scan complete."""
        self.commit()
        if self.format == "parquet":
            self._write_parquet()
        self.complete = True
        self.summary = summary.to_dict()
        self._write_manifest()
        if self.format == "parquet" and self.data_path.exists():
            if self._data is not None:
                self._data.close()
                self._data = None
            self.data_path.unlink()

    def _write_parquet(self) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise InputError("Parquet output needs the scan extra: pip install 'wmark[scan]'") from exc
        schema = pa.schema(
            [
                (c, pa.int64() if c in _INT_COLUMNS else pa.float64() if c in _FLOAT_COLUMNS else pa.string())
                for c in self.columns
            ]
        )
        tmp = self.out.with_name(self.out.name + ".tmp")
        with pq.ParquetWriter(tmp, schema) as writer:
            chunk: list[dict[str, Any]] = []
            for row in self._read_committed():
                chunk.append(row)
                if len(chunk) == 65536:
                    writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                    chunk = []
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.out)
        _fsync_dir(self.out.parent)

    def _write_manifest(self) -> None:
        manifest = {
            "version": MANIFEST_VERSION,
            "output": self.out.name,
            "format": self.format,
            "data_file": self.data_path.name,
            "committed_bytes": self._committed_bytes,
            "committed_rows": self._committed_rows,
            "complete": self.complete,
            "summary": self.summary,
            "settings": self.settings,
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        _write_atomic(self.manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))

    def abandon(self) -> None:
        """Close; a new output with nothing committed is removed, so a retry starts clean."""
        fresh = self.resumed == 0 and self._committed_rows == 0 and not self.complete
        self.close()
        if fresh:
            for path in (self.manifest_path, self.data_path):
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the data file and release the lock (uncommitted rows are dropped)."""
        if self._data is not None:
            self._data.close()
            self._data = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _utf8(value: object) -> object:
    """`value`, a string made writable as UTF-8: the bytes of a file name that are not UTF-8
    (which Python holds as lone surrogates) as \\xNN, any other lone surrogate (from a JSON
    key, say) as \\uNNNN. A name that is valid UTF-8 is written as it is."""
    if not isinstance(value, str):
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
