"""Human-written text already on this machine, for checking a key's false-positive rate.

Nothing here was written by wmark: the Python standard library's source (code), licence and
copyright files, installed packages' descriptions (prose), and Debian changelogs. Repetition
*inside* a document (licence clauses, boilerplate, code idioms) is kept on purpose: it is where
a broken dedup would show.

Near-copies *across* documents are dropped: a document is skipped when more than half of its
8-word shingles already occurred in earlier documents. Identical passages get identical scores
under a key, so near-copies would make the documents' p-values dependent, and the binomial
interval that calibration checks assume independent documents: without the filter the count of
p < 0.01 over the calibration corpus varied across keys far more than a binomial, with it as a
binomial does (BENCHMARKS.md, "Calibration and attacks").
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

__all__ = ["MAX_SHARED", "Document", "shingles", "system_corpus"]

MAX_CHARS = 6000  # about 1,500 tokens: long enough to score, short enough to stay fast
SHINGLE_WORDS = 8
MAX_SHARED = 0.5  # skip a document when more than this share of its shingles were seen before


@dataclass(frozen=True)
class Document:
    """A text and where it came from."""

    source: str
    kind: str
    text: str


def _read(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    text = text.strip()[:MAX_CHARS]
    return text if len(text) >= 200 else None


def _code() -> Iterator[Document]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        if (text := _read(path)) is not None:
            yield Document(str(path), "code", text)


def _licences() -> Iterator[Document]:
    paths = sorted(Path("/usr/share/common-licenses").glob("*"))
    paths += sorted(Path("/usr/share/doc").glob("*/copyright"))
    for site in sorted({Path(p) for p in sysconfig.get_paths().values()}):
        paths += sorted(site.glob("*.dist-info/LICEN[CS]E*")) + sorted(site.glob("*.dist-info/licenses/*"))
    for path in paths:
        if path.is_file() and (text := _read(path)) is not None:
            yield Document(str(path), "licence", text)


def _prose() -> Iterator[Document]:
    sites = sorted({Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})
    for site in sites:
        for meta in sorted(site.glob("*.dist-info/METADATA")):
            try:
                body = Parser().parsestr(meta.read_text(encoding="utf-8")).get_payload()
            except (OSError, UnicodeDecodeError):
                continue
            if isinstance(body, str) and len(body.strip()) >= 200:
                yield Document(str(meta), "prose", body.strip()[:MAX_CHARS])
    for path in sorted(Path("/usr/share/doc").glob("*/changelog*.gz")):
        if (text := _read(path)) is not None:
            yield Document(str(path), "changelog", text)


def shingles(text: str) -> set[bytes]:
    """64-bit hashes of the text's 8-word shingles (one shingle for a shorter text): what the
    near-copy rule compares here and in `wmark calibrate` (`wmark.eval.calibrate`)."""
    words = text.split()
    return {
        hashlib.blake2b(" ".join(words[i : i + SHINGLE_WORDS]).encode(), digest_size=8).digest()
        for i in range(max(1, len(words) - SHINGLE_WORDS + 1))
    }


def system_corpus(limit: int | None = None, *, max_shared: float = MAX_SHARED) -> list[Document]:
    """Distinct human-written documents found on this machine, kinds interleaved, fixed order.

    Args:
        limit: stop after this many documents (None: all of them).
        max_shared: skip a document when more than this share of its shingles occurred in earlier
            documents (1.0 keeps near-copies; exact duplicates are always dropped).
    """
    seen: set[bytes] = set()
    out: list[Document] = []
    streams = [_code(), _licences(), _prose()]
    for doc in itertools.chain.from_iterable(itertools.zip_longest(*streams)):
        if doc is None:
            continue
        found = shingles(doc.text)
        novel = len(found - seen) / len(found)
        seen |= found
        if novel == 0.0 or novel < 1.0 - max_shared:
            continue
        out.append(doc)
        if limit is not None and len(out) >= limit:
            break
    return out
