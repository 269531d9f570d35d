"""Where scanned documents come from: fsspec stores (local, s3://, gs://, zip://, http(s)://, ...)
and SQL tables (`wmark.scan.sql_source`).

A document's identity is (source, doc_id): the file's URL (an absolute path for local files)
and its place in the file, or the SQL URL (password hidden) and the row's id. Identities are
stable across runs, which is what makes a scan resumable. fsspec is imported only when a store
is listed (the `[scan]` extra); file formats are read by `wmark.scan.formats`, files opened by
`wmark.scan.opening`, and every document bounded by `wmark.scan.limits`.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from wmark.errors import InputError
from wmark.scan.formats import FORMATS, WHOLE_FORMATS, Record, compression_of, format_of, records
from wmark.scan.limits import OverLimit, ReadLimits
from wmark.scan.opening import Refused, buffered, check_member, inflate, open_local

__all__ = ["Document", "FileSource", "SourceOptions", "short_message"]


@dataclass(frozen=True)
class Document:
    """One document to scan, or the reason it cannot be read.

    Attributes:
        source: the file URL (absolute path for local files) or the SQL URL.
        doc_id: its place in the source ("" for a whole file, "line:N", "row:N", a SQL id).
        text: the text, None when unreadable.
        error: why it is unreadable, else None.
        nbytes: bytes of the source it accounts for (progress); 0 for SQL rows.
    """

    source: str
    doc_id: str
    text: str | None
    error: str | None
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """How files are read.

    Attributes:
        format: force this format for every file (else by extension).
        field: the jsonl/csv field that holds the text.
        column: the parquet column that holds the text.
        follow_links: read symbolic links that lead out of a walked directory or a glob's
            folder, and walk linked directories; by default a link out of the tree is an error
            row, so a scan of a shared folder never reads what its owner cannot see there.
        limits: the bounds of one document (`--max-doc-bytes`, `--max-ratio`).
    """

    format: str | None = None
    field: str | None = None
    column: str | None = None
    follow_links: bool = False
    limits: ReadLimits = ReadLimits()

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in FORMATS:
            raise InputError(f"unknown format {self.format!r}; known: {', '.join(FORMATS)}")


def _fsspec() -> Any:
    try:
        import fsspec
        import fsspec.core
    except ImportError as exc:
        raise InputError("scanning stores needs the scan extra: pip install 'wmark[scan]'") from exc
    return fsspec


@dataclass(frozen=True)
class _File:
    fs: Any
    path: str
    label: str
    size: int
    format: str
    listing: dict[str, Any]  # what the store says of it (a zip member's declared sizes)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _label(fs: Any, path: str, url: str) -> str:
    if _is_local(fs):
        return os.path.abspath(path)
    label = str(fs.unstrip_protocol(path))
    if "::" not in url:
        return label
    targets = [part if "://" in part else os.path.abspath(part) for part in url.split("::")[1:]]
    return "::".join([label, *targets])


def _is_directory(fs: Any, path: str) -> bool:
    # Any web page with links looks like a directory to fsspec's http store: there, only a URL
    # ending in "/" is read as a directory listing.
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("http", "https"):
        return path.endswith("/")
    return bool(fs.isdir(path))


def _hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/") if part)


def _is_zip(fs: Any) -> bool:
    return type(fs).__name__ == "ZipFileSystem" and hasattr(fs, "zip")


def _leaves_archive(name: str) -> bool:
    """Whether an archive member's stored name is absolute or climbs out ("../../x")."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":")


class FileSource:
    """The files under some fsspec URLs (files, directories walked recursively, globs).

    Listing happens here, at once, so bad URLs fail before a scan starts. Hidden files and
    directories are skipped when a directory is walked or a glob expanded; files of unknown
    format found that way are skipped and counted; a named file of unknown format is an error.
    A local walk or glob does not follow symbolic links out of its folder (nor into linked
    directories) unless `options.follow_links`; a named file is read wherever it leads.

    Args:
        urls: what the user named.
        options: format, field and column.
        exclude: local paths never to read (the scan's own output files).

    Raises:
        InputError: an unknown protocol or a missing driver (e.g. s3fs), a path that does not
            exist, an unknown format, a jsonl/csv file without --field or parquet without --column.
    """

    def __init__(self, urls: Sequence[str], options: SourceOptions, exclude: Collection[str] = ()) -> None:
        if not urls:
            raise InputError("name at least one file, directory, glob or URL to scan")
        fsspec = _fsspec()
        self.options = options
        self.skipped: list[str] = []
        self.unlisted: list[Document] = []  # directories that could not be listed, links not followed
        excluded = {os.path.realpath(p) for p in exclude}
        files: dict[str, _File] = {}
        for url in urls:
            try:
                fs, path = fsspec.core.url_to_fs(url)
            except (ValueError, ImportError, OSError) as exc:
                raise InputError(f"{url}: {short_message(exc)}") from exc
            for name, size, explicit, listing in self._list(fs, path, url):
                if _is_local(fs) and os.path.realpath(name) in excluded:
                    continue
                fmt = options.format or format_of(name)
                label = _label(fs, name, url)
                if fmt is None:
                    if explicit:
                        raise InputError(f"{url}: unknown format; pass --format ({', '.join(FORMATS)})")
                    self.skipped.append(label)
                    continue
                files.setdefault(label, _File(fs, name, label, size, fmt, listing))
        self.files = [files[k] for k in sorted(files)]
        self._check_options()
        self.urls = tuple(urls)
        self.total_bytes = sum(f.size for f in self.files)

    def _check_options(self) -> None:
        formats = {f.format for f in self.files}
        if formats & {"jsonl", "csv"} and not self.options.field:
            raise InputError("jsonl and csv documents need --field NAME (the field that holds the text)")
        if "parquet" in formats and not self.options.column:
            raise InputError("parquet documents need --column NAME (the column that holds the text)")

    def _list(self, fs: Any, path: str, url: str) -> Iterator[tuple[str, int, bool, dict[str, Any]]]:
        try:
            pattern = any(c in path for c in "*?[")
            if _is_local(fs) and not pattern and os.path.isdir(path):
                yield from self._walk_local(path)  # reports directories it cannot list
                return
            if pattern:  # like a shell, a glob does not match hidden names
                found = fs.glob(path, detail=True)
                root = path[: min(path.find(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
                self._refuse_members(fs, url, path.rsplit("/", 1)[-1] if root == "" else None)
                # a FIFO, socket or device is listed ("other") and refused when it is read
                readable = ("file", "other") if _is_local(fs) else ("file",)
                for name in sorted(found):
                    if _hidden(name[len(root) :]) or (_is_zip(fs) and _leaves_archive(name)):
                        continue
                    if _is_local(fs) and found[name].get("islink"):  # listed with its own lstat
                        if not os.path.exists(name):
                            self._dangling(name)
                        elif os.path.isfile(name) and self._inside(name, os.path.realpath(root or "/")):
                            yield name, os.path.getsize(name), False, {}
                    elif found[name].get("type") in readable:
                        yield name, int(found[name].get("size") or 0), False, found[name]
                return
            info = {"type": "directory"} if _is_directory(fs, path) else fs.info(path)
            if info.get("type") == "directory":
                root = path.rstrip("/")
                found = fs.find(path, detail=True)
                self._refuse_members(fs, url, "*" if root == "" else None)
                for name in sorted(found):
                    if not _hidden(name[len(root) :]) and not (_is_zip(fs) and _leaves_archive(name)):
                        yield name, int(found[name].get("size") or 0), False, found[name]
                return
            yield path, int(info.get("size") or 0), True, info
        except FileNotFoundError as exc:
            raise InputError(f"{url}: no such file or directory") from exc
        except (OSError, ValueError) as exc:
            raise InputError(f"{url}: {short_message(exc)}") from exc

    def _refuse_members(self, fs: Any, url: str, pattern: str | None) -> None:
        """An error document for each member of a zip archive whose stored name leaves it
        (absolute, or climbing with ".."), when listing the archive's top with `pattern`.

        Nothing is ever extracted, so such a member could be read harmlessly; but fsspec lists
        it under another name or not at all, and its row would carry an identity that is not
        its own. So it is counted, as an error row under its stored name, and not read.
        """
        if pattern is None or not _is_zip(fs):
            return
        for member in fs.zip.infolist():
            name = member.filename
            if member.is_dir() or not _leaves_archive(name):
                continue
            if fnmatch.fnmatchcase(name.replace("\\", "/").rsplit("/", 1)[-1], pattern):
                message = f"a zip member whose name leaves the archive ({name!r}), not read"
                self.unlisted.append(Document(_label(fs, name, url), "", None, message, 0))

    def _inside(self, path: str, root_real: str) -> bool:
        """Whether a listed file may be read: it resolves inside `root_real`, or links are
        followed; a link out of the tree becomes an error document instead."""
        if self.options.follow_links:
            return True
        real = os.path.realpath(path)
        if os.path.commonpath([real, root_real]) == root_real:
            return True
        message = "a symbolic link out of the scanned folder, not followed (--follow-links reads it)"
        self.unlisted.append(Document(os.path.abspath(path), "", None, message, 0))
        return False

    def _dangling(self, path: str) -> None:
        """A symbolic link whose target is missing: an error document, so the scan's count
        still holds every name it listed (a store restored without its link targets shows)."""
        message = "a symbolic link to a missing file, not read"
        self.unlisted.append(Document(os.path.abspath(path), "", None, message, 0))

    def _walk_local(self, root: str) -> Iterator[tuple[str, int, bool, dict[str, Any]]]:
        def unlisted(exc: OSError) -> None:
            where = os.path.abspath(exc.filename or root)
            self.unlisted.append(
                Document(where, "", None, f"cannot list directory ({short_message(exc)})", 0)
            )

        follow = self.options.follow_links
        root_real = os.path.realpath(root)
        walked: set[str] = set()
        for directory, subdirs, names in os.walk(root, onerror=unlisted, followlinks=follow):
            if follow:  # followed links can lead back up the tree: walk each real directory once
                real = os.path.realpath(directory)
                if real in walked:
                    subdirs[:] = []
                    continue
                walked.add(real)
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for name in sorted(names):
                if name.startswith("."):
                    continue
                path = os.path.join(directory, name)
                if os.path.islink(path) and not self._inside(path, root_real):
                    continue
                try:
                    found = os.stat(path)
                except FileNotFoundError:  # a dangling link, or gone since the listing
                    if os.path.islink(path):
                        self._dangling(path)
                    continue
                except OSError:
                    yield path, 0, False, {}  # reading it will report why
                    continue
                if not stat.S_ISDIR(found.st_mode):  # a FIFO or device is refused when read
                    yield path, found.st_size if stat.S_ISREG(found.st_mode) else 0, False, {}

    def documents(self) -> Iterator[Document]:
        """Every document of every file, files in sorted order, records in file order."""
        yield from self.unlisted
        for file in self.files:
            yield from self._read(file)

    def _read(self, file: _File) -> Iterator[Document]:
        # Whatever goes wrong reading one file (a store error, a corrupt archive: decompressors
        # raise their own exception types) is that file's error document; only the settings'
        # InputErrors (a missing extra) stop the scan.
        limits = self.options.limits
        compression = compression_of(file.path)
        try:
            if _is_zip(file.fs):
                whole = file.format in WHOLE_FORMATS and compression is None
                check_member(file.listing, limits, whole=whole)
            raw = open_local(file.path) if _is_local(file.fs) else file.fs.open(file.path, "rb")
        except InputError:
            raise
        except Refused as exc:
            yield Document(file.label, "", None, str(exc), file.size)
            return
        except Exception as exc:
            yield Document(file.label, "", None, f"cannot read ({_read_message(exc)})", file.size)
            return
        with raw:
            stream: IO[bytes] = raw if _is_local(file.fs) else buffered(raw)
            if compression is not None:
                try:
                    stream = inflate(raw, compression, limits)
                except Exception as exc:
                    yield Document(
                        file.label, "", None, f"cannot decompress ({_read_message(exc)})", file.size
                    )
                    return
            found = records(
                stream,
                file.format,
                field=self.options.field,
                column=self.options.column,
                limits=limits,
                decompressed=compression is not None,
            )
            yield from self._with_sizes(file, raw, found)

    @staticmethod
    def _with_sizes(file: _File, raw: Any, found: Iterator[Record]) -> Iterator[Document]:
        # Each record accounts for the bytes read up to it; the file's last one takes the rest,
        # so a file's documents add up to its size (progress in bytes, even when compressed).
        pending: Record | None = None
        pending_at = accounted = 0
        failure: str | None = None
        while True:
            try:
                record = next(found, None)
            except InputError:
                raise
            except Exception as exc:  # the store failed mid-file, a truncated or corrupt archive
                after = f"after {pending.doc_id}" if pending is not None else "at the start"
                failure = f"read failed {after} ({_read_message(exc)})"
                record = None
            if record is None:
                break
            if pending is not None:
                yield Document(
                    file.label, pending.doc_id, pending.text, pending.error, pending_at - accounted
                )
                accounted = pending_at
            pending = record
            pending_at = min(max(_tell(raw), accounted), file.size)
        rest = max(file.size - accounted, 0)
        if pending is not None:
            yield Document(file.label, pending.doc_id, pending.text, pending.error, 0 if failure else rest)
        if failure is not None:
            yield Document(file.label, "", None, failure, rest)


def _tell(raw: Any) -> int:
    try:
        return int(raw.tell())
    except (OSError, ValueError, AttributeError):
        return 0


def short_message(exc: BaseException) -> str:
    """One line of what went wrong (an OS error's strerror), for an error row or message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _read_message(exc: Exception) -> str:
    # Decompressors and parsers raise their own types (LZMAError, zlib.error, BadZipFile), whose
    # text says little without the type.
    if isinstance(exc, OverLimit):
        return str(exc)
    if isinstance(exc, OSError):
        return short_message(exc)
    kind = type(exc).__name__
    if kind == "error":  # zlib.error, binascii.error: the module names them
        kind = f"{type(exc).__module__}.error"
    return f"{kind}: {short_message(exc)}"
