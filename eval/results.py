"""results.jsonl: a run's rows, one JSON line each, appended durably and read back whole.

A row is appended (one line, flushed and fsynced) as soon as it is done. A line torn by a crash
is dropped on the next start; one process writes a folder at a time, and readers never modify
the file, so a summary can be rebuilt while a run is still appending.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from wmark.errors import InputError
from wmark.eval.rows import EvalRow

__all__ = ["ResultsFile"]


class ResultsFile:
    """results.jsonl: append-only, one JSON row per line, safe against crashes mid-write.

    Only one process writes a folder at a time (`locked`); readers (`load(repair=False)`) never
    modify the file, so a summary can be rebuilt while a run is still appending.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's writer lock for the duration of the block.

        Raises:
            InputError: another process is writing to this folder.
        """
        with (self.path.parent / ".lock").open("ab") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(
                    f"another wmark eval is writing to {self.path.parent}; wait for it to finish"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def load(self, *, repair: bool = False) -> list[EvalRow]:
        """All complete rows. A torn last line (a crash while writing) is skipped, and with `repair`
        (writers only, under `locked`) cut off the file so that appends continue after a whole row.

        Raises:
            InputError: a line other than the last is not valid JSON (the file was edited), or a
                line is not a row.
        """
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        rows: list[EvalRow] = []
        good = 0
        for i, line in enumerate(lines):
            if not line.strip():
                good += len(line) + 1
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                if i < len(lines) - 1:
                    raise InputError(
                        f"{self.path}, line {i + 1}: not valid JSON; fix or remove the line"
                    ) from None
                break  # the torn tail of an interrupted append
            if not isinstance(obj, dict):
                raise InputError(f"{self.path}, line {i + 1}: not a wmark eval row")
            try:
                rows.append(EvalRow.from_json(obj))
            except InputError as exc:
                raise InputError(f"{self.path}, line {i + 1}: {exc}") from None
            good += len(line) + 1
        if repair and good < len(data):
            with self.path.open("r+b") as f:
                f.truncate(good)
        return rows

    def append(self, row: EvalRow) -> None:
        """Append one row durably (written, flushed and fsynced before returning)."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
