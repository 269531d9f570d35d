"""What one scanned document may cost, checked before it is read into memory.

A store is untrusted input: a 2 MB .gz can inflate to gigabytes, one JSONL line can be 100 MB,
a zip member can claim any size. So every document is bounded by `ReadLimits.max_doc_bytes`
before it is materialised: the decompressed bytes of a whole-file document (txt, md, html), of
one JSONL line or CSV record, of one parquet value, the UTF-8 bytes of a SQL text. A tokenizer
makes at most about one token per UTF-8 byte and a character is at least one byte, so the same
bound caps characters and tokens before tokenisation (detection holds about 130 bytes per byte
of text at its peak, hence a default that matches `wmark detect --max-bytes`). A compressed
file may inflate freely up to `max_doc_bytes`; past that, it must stay within `max_ratio` times
the compressed bytes read, so a bomb of many small records stops early too. An over-limit
document becomes one error row that names the limit; the scan goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from wmark.errors import InputError

__all__ = ["DEFAULT_MAX_DOC_BYTES", "DEFAULT_MAX_RATIO", "OverLimit", "ReadLimits", "size_text", "utf8_over"]

DEFAULT_MAX_DOC_BYTES = 4 << 20
DEFAULT_MAX_RATIO = 200  # text compresses 3-15x; gzip bombs reach ~1000x, bzip2 and xz far more


class OverLimit(Exception):
    """A file that went past a limit while it was read; the message names the limit."""


def size_text(n: int) -> str:
    """A byte count as people write it: "16 MiB", "1.5 KiB", "900 bytes"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:,} bytes"


def utf8_over(text: str, limit: int) -> bool:
    """Whether `text` is more than `limit` bytes in UTF-8, encoding it only when its length
    cannot decide (a character takes one to four bytes)."""
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit or text.isascii():
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


MAX_DOC_BYTES_LIMIT = 1 << 30
"""The largest `--max-doc-bytes` (past it a document only becomes a MemoryError row)."""


@dataclass(frozen=True)
class ReadLimits:
    """The bounds of a scan (see the module docstring).

    Attributes:
        max_doc_bytes: largest document, in (decompressed) bytes.
        max_ratio: how many times its compressed size a file may inflate past `max_doc_bytes`.
    """

    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
    max_ratio: int = DEFAULT_MAX_RATIO

    def __post_init__(self) -> None:
        if not 1 <= self.max_doc_bytes <= MAX_DOC_BYTES_LIMIT:
            raise InputError(
                f"--max-doc-bytes must be between 1 and {MAX_DOC_BYTES_LIMIT} (1 GiB: a document "
                f"takes ~130 bytes of memory per byte to detect), got {self.max_doc_bytes}"
            )
        if self.max_ratio < 1:
            raise InputError(f"--max-ratio must be >= 1, got {self.max_ratio}")

    def too_big(self, what: str, *, decompressed: bool = False) -> str:
        """The error of a `what` ("document", "line", ...) over `max_doc_bytes`."""
        after = " after decompression" if decompressed else ""
        return f"{what} over --max-doc-bytes ({size_text(self.max_doc_bytes)}){after}"

    def inflates(self, inflated: int, compressed: int) -> bool:
        """Whether `inflated` bytes out of `compressed` bytes break the ratio limit."""
        return inflated > self.max_doc_bytes and inflated > self.max_ratio * max(compressed, 1)

    def too_inflated(self) -> str:
        """The error of a file that broke the ratio limit."""
        return (
            f"the file inflates more than --max-ratio ({self.max_ratio}:1) past "
            f"{size_text(self.max_doc_bytes)}: a compression bomb?"
        )
