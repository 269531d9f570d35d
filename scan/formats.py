"""Document formats: turn one file's bytes into records (a text, or why there is none).

txt and md are one document per file, html one document of its visible text; jsonl and csv
hold one document per record (the text in a named field), parquet one per row (a named
column). Nothing here opens files or knows where they live (that is `wmark.scan.sources`);
pyarrow is imported only to read parquet. Every document is bounded before it is read whole
(`wmark.scan.limits`): a whole file, a JSONL line, a CSV record or a parquet value over
`max_doc_bytes` is one error record, and the records after it are still read.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import IO, Any

from wmark.errors import InputError
from wmark.scan.limits import ReadLimits

__all__ = ["FORMATS", "WHOLE_FORMATS", "Record", "compression_of", "format_of", "records", "visible_text"]

FORMATS = ("txt", "md", "html", "jsonl", "csv", "parquet")
WHOLE_FORMATS = frozenset({"txt", "md", "html"})  # one document per file
_EXTENSIONS = {
    "txt": "txt",
    "text": "txt",
    "md": "md",
    "markdown": "md",
    "html": "html",
    "htm": "html",
    "jsonl": "jsonl",
    "ndjson": "jsonl",
    "csv": "csv",
    "parquet": "parquet",
    "pq": "parquet",
}
_COMPRESSIONS = {"gz": "gzip", "bz2": "bz2", "xz": "xz", "lzma": "lzma"}
_CSV_FIELD_LIMIT = 1 << 28  # the csv module's default (128 KiB) is shorter than many documents


@dataclass(frozen=True)
class Record:
    """One document inside a file.

    Attributes:
        doc_id: its place in the file: "" for the whole file, "line:N" (1-based line of a jsonl
            file), "row:N" (0-based data row of a csv or parquet file).
        text: the text, None when it cannot be read.
        error: why it cannot be read, None when it can.
    """

    doc_id: str
    text: str | None
    error: str | None = None


def _suffixes(name: str) -> list[str]:
    base = name.rsplit("/", 1)[-1]
    return [s.lower() for s in base.split(".")[1:]]


def compression_of(name: str) -> str | None:
    """The compression a file name says (gzip, bz2, xz, lzma), or None."""
    suffixes = _suffixes(name)
    return _COMPRESSIONS.get(suffixes[-1]) if suffixes else None


def format_of(name: str) -> str | None:
    """The document format a file name says, looking past a compression suffix; None if unknown."""
    suffixes = _suffixes(name)
    if suffixes and suffixes[-1] in _COMPRESSIONS:
        suffixes = suffixes[:-1]
    return _EXTENSIONS.get(suffixes[-1]) if suffixes else None


def records(
    stream: IO[bytes],
    fmt: str,
    *,
    field: str | None = None,
    column: str | None = None,
    limits: ReadLimits | None = None,
    decompressed: bool = False,
) -> Iterator[Record]:
    """The documents of one file.

    Args:
        stream: the file's (decompressed) bytes.
        fmt: one of `FORMATS`.
        field: the jsonl/csv field holding the text.
        column: the parquet column holding the text.
        limits: the bounds of one document (default: `ReadLimits()`).
        decompressed: `stream` was decompressed (said in the over-limit error).

    Yields:
        Records in file order. A problem with one record (too long, nested too deeply, not
        text) gives that record an error; a problem with the whole file (bad encoding, corrupt
        parquet, missing column) gives one record with doc_id "" and ends the file.
    """
    limits = limits or ReadLimits()
    if fmt in ("txt", "md"):
        yield _whole(stream, _decode, limits, decompressed)
    elif fmt == "html":
        yield _whole(stream, lambda data: visible_text(_decode_html(data)), limits, decompressed)
    elif fmt == "jsonl":
        yield from _jsonl(stream, _required(field, "jsonl", "--field"), limits, decompressed)
    elif fmt == "csv":
        yield from _csv(stream, _required(field, "csv", "--field"), limits, decompressed)
    elif fmt == "parquet":
        yield from _parquet(stream, _required(column, "parquet", "--column"), limits)
    else:
        raise InputError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def _required(name: str | None, fmt: str, flag: str) -> str:
    if not name:
        raise InputError(f"{fmt} documents need {flag} NAME (where the text is)")
    return name


class _Unreadable(Exception):
    """A file or record that cannot be turned into text (the message says why)."""


def _whole(
    stream: IO[bytes], to_text: Callable[[bytes], str], limits: ReadLimits, decompressed: bool
) -> Record:
    data = stream.read(limits.max_doc_bytes + 1)  # no further: the rest is never read
    if len(data) > limits.max_doc_bytes:
        return Record("", None, limits.too_big("document", decompressed=decompressed))
    try:
        return Record("", to_text(data))
    except _Unreadable as exc:
        return Record("", None, str(exc))


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"not UTF-8 text (byte {exc.start} is invalid)") from exc


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def _decode_html(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        declared = _META_CHARSET.search(data[:4096])
        if declared is None:
            raise _Unreadable(f"not UTF-8 and no <meta charset> (byte {exc.start} is invalid)") from exc
        name = declared.group(1).decode("ascii")
        try:
            return data.decode(codecs.lookup(name).name)
        except (LookupError, UnicodeDecodeError) as exc2:
            raise _Unreadable(f"cannot decode as its declared charset {name!r}") from exc2


_SKIPPED = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe", "object"})
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
)
_PARAGRAPH = frozenset(
    {
        "address", "article", "aside", "blockquote", "details", "dl", "figure", "footer", "form",
        "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "main", "nav", "ol", "p", "pre",
        "section", "table", "ul",
    }
)  # fmt: skip
_LINE = frozenset({"br", "dd", "div", "dt", "figcaption", "li", "summary", "td", "th", "tr"})
_LINE_BREAK, _PARAGRAPH_BREAK = "\x01", "\x02"  # placeholders, resolved once the page is read
_BREAKS = re.compile("[ \x01\x02]*[\x01\x02][ \x01\x02]*")


class _VisibleText(HTMLParser):
    """Collects the text a browser shows: no scripts, styles, head or hidden elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip: list[list[Any]] = []  # [tag, nesting depth] of the element being skipped
        self._pre = 0

    def _break(self, tag: str) -> None:
        if tag in _PARAGRAPH:
            self.parts.append(_PARAGRAPH_BREAK)
        elif tag in _LINE:
            self.parts.append(_LINE_BREAK)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip:
            if tag == self._skip[-1][0]:
                self._skip[-1][1] += 1
            return
        if tag in _VOID:
            self._break(tag)
            return
        if tag in _SKIPPED or any(name == "hidden" for name, _ in attrs):
            self._skip.append([tag, 1])
            return
        if tag == "pre":
            self._pre += 1
        self._break(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            if tag == self._skip[-1][0]:
                self._skip[-1][1] -= 1
                if self._skip[-1][1] == 0:
                    self._skip.pop()
            return
        if tag == "pre" and self._pre:
            self._pre -= 1
        self._break(tag)

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))


def visible_text(html: str) -> str:
    """The visible text of an HTML page: blocks on their own lines, paragraphs apart, entities
    decoded, whitespace collapsed as a browser does (kept inside <pre>)."""
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    text = _BREAKS.sub(lambda m: "\n\n" if _PARAGRAPH_BREAK in m.group() else "\n", "".join(parser.parts))
    return text.strip()


def _record(doc_id: str, value: Any, what: str) -> Record:
    if isinstance(value, str):
        return Record(doc_id, value)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return Record(doc_id, bytes(value).decode("utf-8"))
        except UnicodeDecodeError as exc:
            return Record(doc_id, None, f"{what} is not UTF-8 text (byte {exc.start} is invalid)")
    if value is None:
        return Record(doc_id, None, f"{what} is null")
    return Record(doc_id, None, f"{what} is not text ({type(value).__name__})")


def _lines(stream: IO[bytes], limit: int) -> Iterator[bytes | None]:
    """The lines of a file, None for one over `limit` bytes (read past in chunks, never whole)."""
    while line := stream.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        while (rest := stream.readline(1 << 16)) and not rest.endswith(b"\n"):
            pass
        yield None


def _jsonl(stream: IO[bytes], field: str, limits: ReadLimits, decompressed: bool) -> Iterator[Record]:
    for number, line in enumerate(_lines(stream, limits.max_doc_bytes), start=1):
        doc_id = f"line:{number}"
        if line is None:
            yield Record(doc_id, None, limits.too_big("line", decompressed=decompressed))
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8-sig" if number == 1 else "utf-8"))
        except RecursionError:  # the parser's own depth guard; this record only
            yield Record(doc_id, None, "invalid JSON (nested too deeply)")
            continue
        except UnicodeDecodeError as exc:
            yield Record(doc_id, None, f"not UTF-8 text (byte {exc.start} of the line is invalid)")
            continue
        except json.JSONDecodeError as exc:
            yield Record(doc_id, None, f"invalid JSON ({exc.msg} at column {exc.colno})")
            continue
        except ValueError:  # an integer past Python's 4,300-digit conversion limit
            yield Record(doc_id, None, "invalid JSON (a number too long to read)")
            continue
        if not isinstance(obj, dict):
            yield Record(doc_id, None, f"not a JSON object ({type(obj).__name__})")
        elif field not in obj:
            yield Record(doc_id, None, f"no field {field!r} (fields: {', '.join(map(str, obj))[:200]})")
        else:
            yield _record(doc_id, obj[field], f"field {field!r}")


class _RecordTooLong(Exception):
    """A csv record over the limit; the rest of its line was read past."""


class _CsvLines:
    """A csv file's physical lines for `csv.reader`, at most `limit` characters per record.

    A record can span lines (quoted newlines): `record` counts the characters of the one being
    read and `new_record` starts the next. Past the limit, the rest of the line is read past in
    chunks and `_RecordTooLong` raised; `csv.reader` starts afresh at the next line (a record
    over the limit inside a multi-line quoted field can leave the next rows misaligned).
    """

    def __init__(self, text: IO[str], limit: int) -> None:
        self._text = text
        self._limit = limit
        self.record = 0

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = self._text.readline(self._limit + 1)
        if not line:
            raise StopIteration
        self.record += len(line.rstrip("\r\n"))
        if self.record > self._limit:
            while not line.endswith(("\n", "\r")) and (line := self._text.readline(1 << 16)):
                pass
            self.new_record()
            raise _RecordTooLong
        return line

    def new_record(self) -> None:
        """The previous record is complete."""
        self.record = 0


def _csv(stream: IO[bytes], field: str, limits: ReadLimits, decompressed: bool) -> Iterator[Record]:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
    lines = _CsvLines(text, limits.max_doc_bytes)
    reader = csv.reader(lines)
    too_long = limits.too_big("row", decompressed=decompressed)
    row = -1
    try:
        try:
            header = next(reader, None)
        except _RecordTooLong:
            yield Record("", None, f"the header {too_long}")
            return
        if header is None:
            yield Record("", None, "empty csv file (no header row)")
            return
        if field not in header:
            yield Record("", None, f"no column {field!r} in the header ({', '.join(header)[:200]})")
            return
        index = header.index(field)
        while True:
            row += 1
            lines.new_record()
            try:
                values = next(reader, None)
            except _RecordTooLong:
                yield Record(f"row:{row}", None, too_long)
                continue
            if values is None:
                break
            if index >= len(values):
                yield Record(
                    f"row:{row}", None, f"the row has {len(values)} fields, the header {len(header)}"
                )
            else:
                yield Record(f"row:{row}", values[index])
    except UnicodeDecodeError as exc:
        yield Record(
            "",
            None,
            f"not UTF-8 text after data row {max(row - 1, -1)} (byte {exc.start} of a block is invalid)",
        )
    except csv.Error as exc:
        yield Record("", None, f"malformed csv after data row {max(row - 1, -1)} ({exc})")
    finally:
        text.detach()  # the caller closes the underlying stream


def _parquet(stream: IO[bytes], column: str, limits: ReadLimits) -> Iterator[Record]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError("reading parquet needs the scan extra: pip install 'wmark[scan]'") from exc
    row = 0
    try:
        parquet = pq.ParquetFile(stream)
        names = parquet.schema_arrow.names
        if column not in names:
            yield Record("", None, f"no column {column!r} (columns: {', '.join(names)[:200]})")
            return
        for group in range(parquet.metadata.num_row_groups):
            if (bomb := _inflated_group(parquet.metadata.row_group(group), column, limits)) is not None:
                yield Record("", None, f"parquet row group {group}: {bomb}")
                return
            for batch in parquet.iter_batches(batch_size=1024, columns=[column], row_groups=[group]):
                for record in _values(batch.column(0), row, f"column {column!r}", limits):
                    yield record
                    row += 1
    except (pa.ArrowException, ValueError) as exc:
        where = "not a readable parquet file" if row == 0 else f"corrupt parquet after row {row - 1}"
        yield Record("", None, f"{where} ({_first_line(exc)})")


def _inflated_group(group: Any, column: str, limits: ReadLimits) -> str | None:
    """Why a row group's column chunks inflate past the ratio limit (parquet compresses each
    page itself, so a bomb needs no .gz), from the sizes the footer declares; else None."""
    chunks = [group.column(i) for i in range(group.num_columns)]
    mine = [c for c in chunks if c.path_in_schema == column or c.path_in_schema.startswith(f"{column}.")]
    inflated = sum(c.total_uncompressed_size for c in mine)
    compressed = sum(c.total_compressed_size for c in mine)
    if not limits.inflates(inflated, compressed):
        return None
    return f"{limits.too_inflated()} (it says {inflated:,} from {compressed:,} bytes)"


def _values(values: Any, first_row: int, what: str, limits: ReadLimits) -> Iterator[Record]:
    """The records of a batch of one column; a value over `max_doc_bytes` is never made a str."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    sizes = pc.binary_length(values).to_pylist() if any(k(values.type) for k in kinds) else None
    if sizes is None or max((n or 0 for n in sizes), default=0) <= limits.max_doc_bytes:
        for offset, value in enumerate(values.to_pylist()):
            yield _record(f"row:{first_row + offset}", value, what)
        return
    for offset, size in enumerate(sizes):
        doc_id = f"row:{first_row + offset}"
        if size is not None and size > limits.max_doc_bytes:
            yield Record(doc_id, None, limits.too_big("value"))
        else:
            yield _record(doc_id, values[offset].as_py(), what)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
