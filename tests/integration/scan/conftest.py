"""What the scan tests share: a document store of every format (`corpus`) and `scans`, which
scans with the test key (test modules cannot import each other or conftest, so it is a fixture).

Keys have fixed secrets; watermarked documents carry a real (planted) keyed-race watermark, human
ones are i.i.d. words, so at alpha = 1e-4 a wrong verdict has probability < 1e-4 per document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wmark import KeyMaterial
from wmark.scan.journal import Journal
from wmark.scan.loop import run_scan
from wmark.scan.rows import ScanSummary
from wmark.scan.scan import scan
from wmark.scan.sources import Document, SourceOptions
from wmark.scan.workers import WorkerConfig

ALPHA = 1e-4
CORPUS_DOCS = 2 + 301 + 40 + 20 + 2  # the documents of `corpus`, its broken line included


@dataclass(frozen=True)
class Scans:
    """Scans with one key (the test's) and its tokenizer."""

    key: KeyMaterial
    tokenizer_json: bytes
    alpha: float = ALPHA
    options: SourceOptions = SourceOptions(field="text", column="text")
    corpus_docs: int = CORPUS_DOCS

    @staticmethod
    def words(ids: Iterable[int]) -> str:
        """Token IDs of the word tokenizer as its text."""
        return " ".join(f"w{i - 1}" for i in ids)

    @staticmethod
    def human(rng: np.random.Generator, n: int = 120) -> str:
        """n i.i.d. words: text no key marked."""
        return " ".join(f"w{i}" for i in rng.integers(0, 500, size=n))

    @staticmethod
    def jsonl(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    @property
    def tokenizers(self) -> dict[str, bytes]:
        return {self.key.spec.tokenizer.sha256: self.tokenizer_json}

    def run(self, root: Path, out: Path, **kw: Any) -> ScanSummary:
        """`wmark.scan.scan` of `root` into `out`, in-process unless `workers` says otherwise."""
        return scan(
            urls=[str(root)],
            options=self.options,
            keys=[self.key],
            tokenizers=self.tokenizers,
            out=out,
            alpha=self.alpha,
            **{"workers": 0, **kw},
        )

    @property
    def config(self) -> WorkerConfig:
        return WorkerConfig(keys=(self.key,), tokenizers=self.tokenizers, alpha=self.alpha, min_window=32)

    def journal(
        self, docs: list[Document], executor: Any, out: Path, **kw: Any
    ) -> tuple[ScanSummary, list[dict]]:
        """`docs` through `run_scan` on `executor` into a new journal at `out` (both closed after):
        the summary and the rows."""
        journal = Journal.open(out, settings={})
        try:
            summary = run_scan(iter(docs), journal=journal, executor=executor, **kw)
        finally:
            journal.close()
            executor.close()
        return summary, self.jsonl(out)


@pytest.fixture()
def scans(word_key: KeyMaterial, word_tokenizer_json: bytes) -> Scans:
    return Scans(word_key, word_tokenizer_json)


@pytest.fixture()
def corpus(tmp_path: Path, word_key, planted) -> tuple[Path, set[tuple[str, str]]]:
    """A folder of every format; returns it and the identities of the watermarked documents."""
    rng = np.random.default_rng(1)
    root = tmp_path / "docs"
    (root / "deep").mkdir(parents=True)
    marked: set[tuple[str, str]] = set()
    (root / "marked.txt").write_text(Scans.words(planted(word_key, 150, rng)), encoding="utf-8")
    marked.add((str(root / "marked.txt"), ""))
    (root / "human.md").write_text(Scans.human(rng), encoding="utf-8")
    lines = []
    for i in range(1, 301):
        if i % 50 == 0:
            lines.append(json.dumps({"text": Scans.words(planted(word_key, 120, rng))}))
            marked.add((str(root / "deep" / "posts.jsonl"), f"line:{i}"))
        else:
            lines.append(json.dumps({"text": Scans.human(rng)}))
    lines.append("{broken json")
    (root / "deep" / "posts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    texts = [Scans.human(rng) for _ in range(40)]
    texts[7] = Scans.words(planted(word_key, 120, rng))
    marked.add((str(root / "table.parquet"), "row:7"))
    pq.write_table(pa.table({"text": texts}), root / "table.parquet")
    (root / "c.csv").write_text(
        "text\n" + "\n".join(Scans.human(rng) for _ in range(20)) + "\n", encoding="utf-8"
    )
    (root / "latin1.txt").write_bytes("caf\xe9 w1 w2".encode("latin-1"))
    (root / "blank.txt").write_text("  \n", encoding="utf-8")
    return root, marked
