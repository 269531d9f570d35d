"""Documents of a SQL table: the rows of a `SELECT id, text ...` query, streamed through SQLAlchemy.

A row's identity is (the SQL URL with its password hidden, the row's id), stable across runs
like a file's (`wmark.scan.sources`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wmark.errors import InputError
from wmark.scan.sources import Document, short_message

__all__ = ["SqlSource"]


class SqlSource:
    """Rows of a SQL query, `SELECT id, text FROM ...`, read as a stream through SQLAlchemy.

    The connection and the query are checked when the source is built, so an unreachable
    database or a bad query fails before a scan starts. The first column identifies a row and
    must be unique; the second holds the text.

    Args:
        url: a SQLAlchemy database URL.
        query: a SELECT with exactly two columns.

    Raises:
        InputError: a malformed URL, a missing driver, an unreachable database, a bad query or
            one that does not return two columns.
    """

    def __init__(self, url: str, query: str) -> None:
        from sqlalchemy import create_engine, make_url, text
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

        try:
            parsed = make_url(url)
            self.engine = create_engine(parsed)
        except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
            raise InputError(f"--sql: not a usable database URL ({short_message(exc)})") from exc
        self.label = parsed.render_as_string(hide_password=True)
        self.query = query.strip().rstrip(";").strip()
        self._text = text
        self._result: Any = None
        try:
            self._connection = self.engine.connect()
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise InputError(f"--sql: cannot connect to {self.label} ({_sql_message(exc)})") from exc
        try:
            result = self._connection.execution_options(yield_per=1000).execute(text(self.query))
        except SQLAlchemyError as exc:
            self.close()
            raise InputError(f"--query failed on {self.label}: {_sql_message(exc)}") from exc
        self._result = result
        if not result.returns_rows:  # never committed: the connection closes with a rollback
            self.close()
            raise InputError("--query must be a SELECT returning (id, text)")
        columns = list(result.keys())
        if len(columns) != 2:
            self.close()
            raise InputError(f"--query must return two columns (id, text), got {len(columns)}: {columns}")

    def count(self) -> int | None:
        """How many rows the query returns, when the database can say it cheaply enough."""
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.connect() as conn:
                found = conn.execute(
                    self._text(f"SELECT COUNT(*) FROM ({self.query}) AS wmark_scan")
                ).scalar()
        except SQLAlchemyError:
            return None
        return int(found) if found is not None else None

    def documents(self) -> Iterator[Document]:
        """Every row as a document, in the query's order.

        Raises:
            InputError: an id that is NULL or returned twice (identities would not be stable).
        """
        seen: set[str] = set()
        for doc_id_value, value in self._result:
            if doc_id_value is None:
                raise InputError("--query returned a NULL id: the first column must identify each row")
            doc_id = str(doc_id_value)
            if doc_id in seen:
                raise InputError(f"--query returned id {doc_id!r} twice: the first column must be unique")
            seen.add(doc_id)
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


def _sql_message(exc: BaseException) -> str:
    original = getattr(exc, "orig", None)
    return short_message(original if original is not None else exc)
