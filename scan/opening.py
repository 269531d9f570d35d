"""Opening a listed file for reading without trusting it: a local file only if it is regular,
decompression streamed through the ratio limit, zip members checked by what the archive says.

A FIFO, socket or device would block `open()` forever (a FIFO without a writer) or have side
effects, and a file can be swapped for one between listing and reading: a local file is stat'ed,
then opened with O_NONBLOCK and fstat'ed again, and read only if both say regular. A compressed
stream counts the compressed bytes it consumes and the bytes it delivers (`ReadLimits.inflates`).
A member of a zip archive is inflated by `zipfile` itself, which never delivers more than the
member's declared size: that size is checked against the limits before the member is opened.
"""

from __future__ import annotations

import io
import os
import stat
from typing import IO, Any

from wmark.scan.limits import OverLimit, ReadLimits

__all__ = ["Refused", "buffered", "check_member", "inflate", "open_local"]

_BUFFER = 1 << 16
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


class Refused(Exception):
    """A file that is not read at all (the message says why): one error row."""


def _not_regular(mode: int) -> Refused:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return Refused(f"not a regular file ({kind}), not read")


def open_local(path: str) -> IO[bytes]:
    """A local regular file opened for reading; `Refused` for anything else, never blocking."""
    listed = os.stat(path).st_mode
    if not stat.S_ISREG(listed):
        raise _not_regular(listed)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # swapped for a FIFO since the stat: O_NONBLOCK returns at once
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(mode)
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=_BUFFER)  # noqa: SIM115 - the caller closes it
    except BaseException:
        os.close(fd)
        raise


def check_member(info: dict[str, Any], limits: ReadLimits, *, whole: bool) -> None:
    """`Refused` for a zip member whose declared sizes break the limits (`info`: its listing).

    Args:
        info: fsspec's listing of the member (zipfile's `file_size` and `compress_size`).
        limits: the scan's limits.
        whole: the member is one document (txt, md, html), so `max_doc_bytes` bounds it whole.
    """
    size, compressed = info.get("file_size"), info.get("compress_size")
    if not isinstance(size, int) or not isinstance(compressed, int):
        return
    if whole and size > limits.max_doc_bytes:
        declared = f"the archive says {size:,} bytes"
        raise Refused(f"{limits.too_big('document', decompressed=True)} ({declared})")
    if limits.inflates(size, compressed):
        raise Refused(f"{limits.too_inflated()} (the archive says {size:,} from {compressed:,} bytes)")


class _Counted(io.RawIOBase):
    """A file object as a raw stream, counting the bytes taken from it (by a decompressor)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        self.consumed += len(data)
        return len(data)

    def seekable(self) -> bool:
        return bool(self._raw.seekable())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())


class _Metered(io.RawIOBase):
    """A decompressed stream that raises `OverLimit` once it delivers too much for what it took."""

    def __init__(self, stream: IO[bytes], counted: _Counted, limits: ReadLimits) -> None:
        super().__init__()
        self._stream = stream
        self._counted = counted
        self._limits = limits
        self.delivered = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        self.delivered += len(data)
        self._check(self.delivered)
        return len(data)

    def _check(self, inflated: int) -> None:
        if self._limits.inflates(inflated, self._counted.consumed):
            raise OverLimit(self._limits.too_inflated())

    def seekable(self) -> bool:
        return bool(self._stream.seekable())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = int(self._stream.seek(offset, whence))  # parquet reads its footer first
        self._check(position)
        return position

    def tell(self) -> int:
        return int(self._stream.tell())

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            super().close()


def buffered(raw: IO[bytes]) -> IO[bytes]:
    """`raw` as a standard buffered reader: the formats read lines with `readline(limit)`,
    which fsspec's own file objects do not take. Closing the result leaves `raw` open."""
    return io.BufferedReader(_Counted(raw), _BUFFER)


def inflate(raw: IO[bytes], compression: str, limits: ReadLimits) -> IO[bytes]:
    """The decompressed bytes of `raw` (fsspec's gzip, bz2, xz or lzma reader), metered.

    Decompressors hand out what is asked of them (bounded reads), and `_Metered` stops the
    file once it breaks the ratio limit. Closing the result leaves `raw` open.
    """
    from fsspec.compression import compr

    counted = _Counted(raw)
    return io.BufferedReader(_Metered(compr[compression](counted, mode="rb"), counted, limits), _BUFFER)
