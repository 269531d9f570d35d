"""Documents of a SQL table: the rows of a `SELECT id, text ...` query, streamed through SQLAlchemy.

A row's identity is (the SQL URL with its password hidden, the row's id), stable across runs
like a file's (`wmark.scan.sources`).

A table is untrusted input like a file (`wmark.scan.limits`): one row may hold a text of
gigabytes. So the query runs wrapped, and the database itself replaces a text longer than
`max_doc_bytes` by NULL and says how long it was: such a row becomes an error row without its
text ever crossing the connection. `length()` counts characters in some databases and bytes in
others, and a character is 1 to 4 UTF-8 bytes, so a text that passes is at most 4 x
`max_doc_bytes` bytes; its UTF-8 size is checked again once fetched. The rows are fetched a few
at a time, as many as fit `FETCH_BUDGET` at that worst case.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wmark.errors import InputError
from wmark.scan.limits import ReadLimits, utf8_over
from wmark.scan.sources import Document, short_message

__all__ = ["FETCH_BUDGET", "SqlSource"]

FETCH_BUDGET = 256 << 20
"""Bytes of text one fetch may bring at most (rows x their largest size that passes the limit)."""


class SqlSource:
    """Rows of a SQL query, `SELECT id, text FROM ...`, read as a stream through SQLAlchemy.

    The connection and the query are checked when the source is built, so an unreachable
    database or a bad query fails before a scan starts. The first column identifies a row and
    must be unique; the second holds the text.

    Args:
        url: a SQLAlchemy database URL.
        query: a SELECT with exactly two columns.
        limits: `max_doc_bytes` bounds each text before it is fetched (see the module docstring).

    Raises:
        InputError: a malformed URL, a missing driver, an unreachable database, a bad query, one
            that does not return two columns, or a second column that has no length (an integer
            in PostgreSQL: not a text).
    """

    def __init__(self, url: str, query: str, limits: ReadLimits | None = None) -> None:
        from sqlalchemy import create_engine, make_url, text
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

        try:
            parsed = make_url(url)
            self.engine = create_engine(parsed)
        except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
            raise InputError(f"--sql: not a usable database URL ({short_message(exc)})") from exc
        self.label = parsed.render_as_string(hide_password=True)
        self.query = query.strip().rstrip(";").strip()
        self.limits = limits or ReadLimits()
        self._text = text
        self._result: Any = None
        try:
            self._connection = self.engine.connect()
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise InputError(f"--sql: cannot connect to {self.label} ({_sql_message(exc)})") from exc
        try:  # no row: the columns, and a query that is not a plain SELECT fails here
            probe = self._connection.execute(
                text(f"SELECT * FROM ({self.query}\n) AS wmark_probe WHERE 1 = 0")
            )
        except SQLAlchemyError as exc:
            self.close()
            raise InputError(f"--query failed on {self.label}: {_sql_message(exc)}") from exc
        columns = list(probe.keys())
        probe.close()
        if len(columns) != 2:
            self.close()
            raise InputError(f"--query must return two columns (id, text), got {len(columns)}: {columns}")
        rows = max(1, min(1000, FETCH_BUDGET // (4 * self.limits.max_doc_bytes)))
        try:
            self._result = self._connection.execution_options(yield_per=rows).execute(
                text(_bounded(self.query)), {"wmark_max": self.limits.max_doc_bytes}
            )
        except SQLAlchemyError as exc:
            self.close()
            raise InputError(
                f"--query's second column has no length on {self.label}: it must be text or bytes "
                f"({_sql_message(exc)})"
            ) from exc

    def count(self) -> int | None:
        """How many rows the query returns, when the database can say it cheaply enough."""
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.connect() as conn:
                found = conn.execute(
                    self._text(f"SELECT COUNT(*) FROM ({self.query}\n) AS wmark_scan")
                ).scalar()
        except SQLAlchemyError:
            return None
        return int(found) if found is not None else None

    def documents(self) -> Iterator[Document]:
        """Every row as a document, in the query's order; a text over the limit is an error row.

        Raises:
            InputError: an id that is NULL or returned twice (identities would not be stable).
        """
        seen: set[str] = set()
        too_big = self.limits.too_big("text")
        for doc_id_value, value, length in self._result:
            if doc_id_value is None:
                raise InputError("--query returned a NULL id: the first column must identify each row")
            doc_id = str(doc_id_value)
            if doc_id in seen:
                raise InputError(f"--query returned id {doc_id!r} twice: the first column must be unique")
            seen.add(doc_id)
            if value is None and length is not None:  # withheld by the database: over the limit
                yield Document(self.label, doc_id, None, too_big, 0)
                continue
            if isinstance(value, bytes | bytearray | memoryview):
                try:
                    value = bytes(value).decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield Document(
                        self.label, doc_id, None, f"not UTF-8 text (byte {exc.start} is invalid)", 0
                    )
                    continue
            if value is None:
                yield Document(self.label, doc_id, None, "the text is NULL", 0)
            elif not isinstance(value, str):
                yield Document(self.label, doc_id, None, f"the text is not text ({type(value).__name__})", 0)
            elif utf8_over(value, self.limits.max_doc_bytes):
                yield Document(self.label, doc_id, None, too_big, 0)
            else:
                yield Document(self.label, doc_id, value, None, 0)

    def close(self) -> None:
        """Release the cursor and the connection."""
        if self._result is not None:
            self._result.close()
        self._connection.close()
        self.engine.dispose()

    def __enter__(self) -> SqlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bounded(query: str) -> str:
    """`query` with its text replaced by NULL past `:wmark_max`, and the text's length beside it.

    A CTE names the two columns whatever the query calls them (two may share a name, or have
    none); the newline keeps a trailing `--` comment of the query from swallowing the rest.
    """
    return (
        f"WITH wmark_doc (wmark_id, wmark_text) AS ({query}\n) "
        "SELECT wmark_id, CASE WHEN length(wmark_text) > :wmark_max THEN NULL ELSE wmark_text END, "
        "length(wmark_text) FROM wmark_doc"
    )


def _sql_message(exc: BaseException) -> str:
    original = getattr(exc, "orig", None)
    return short_message(original if original is not None else exc)
