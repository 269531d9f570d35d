"""The SQL scan source on real tables (SQLite and PostgreSQL): streamed rows, stable identities,
errors before a scan starts, and texts over the limit withheld by the database."""

from __future__ import annotations

import tracemalloc

import pytest
from sqlalchemy import create_engine, text

from wmark.errors import InputError
from wmark.scan.limits import ReadLimits
from wmark.scan.sql_source import SqlSource


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request, tmp_path) -> str:
    url = (
        f"sqlite:///{tmp_path / 'posts.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE posts (id INTEGER PRIMARY KEY, body TEXT, kind TEXT)"))
        conn.execute(
            text("INSERT INTO posts (id, body, kind) VALUES (:id, :body, :kind)"),
            [{"id": i, "body": f"post number {i}", "kind": "a" if i % 2 else "b"} for i in range(1, 2501)]
            + [{"id": 9999, "body": None, "kind": "a"}],
        )
    engine.dispose()
    return url


def test_sql_table_is_streamed_by_id(sql_url):
    with SqlSource(sql_url, "SELECT id, body FROM posts WHERE kind = 'a' ORDER BY id;") as source:
        assert source.count() == 1251
        docs = list(source.documents())
    assert len(docs) == 1251
    assert (docs[0].doc_id, docs[0].text) == ("1", "post number 1")
    assert (docs[-1].doc_id, docs[-1].error) == ("9999", "the text is NULL")
    assert {d.source for d in docs} == {source.label}


def test_sql_duplicate_ids_stop_the_source(sql_url):
    with (
        SqlSource(sql_url, "SELECT kind, body FROM posts ORDER BY id") as source,
        pytest.raises(InputError, match="twice"),
    ):
        list(source.documents())


def test_sql_errors_fail_before_scanning(sql_url):
    with pytest.raises(InputError, match="two columns"):
        SqlSource(sql_url, "SELECT id, body, kind FROM posts")
    with pytest.raises(InputError, match="--query failed"):
        SqlSource(sql_url, "SELECT id, body FROM no_such_table")
    with pytest.raises(InputError, match="cannot connect"):
        SqlSource("postgresql+psycopg://nobody:secret@127.0.0.1:9/none", "SELECT 1, 2")
    with pytest.raises(InputError, match="not a usable database URL"):
        SqlSource("notadb://x", "SELECT 1, 2")
    with pytest.raises(InputError, match="--query failed"):  # not a SELECT: the probe's syntax error
        SqlSource(sql_url, "DELETE FROM posts")
    with SqlSource(sql_url, "SELECT id, body FROM posts") as source:
        assert source.count() == 2501  # the DELETE was rolled back


def test_sql_text_over_the_limit_never_leaves_the_database(sql_url):
    # 8 MiB of text in one row, a 64 KiB limit: the database withholds it, so no Python string
    # of it is ever built. tracemalloc sees every str and bytes the driver makes (sqlite3 and
    # psycopg build them in Python objects); the peak bound of 2 MiB leaves room for a fetch of
    # the small rows (FETCH_BUDGET // (4 x 64 KiB), capped at 1000 rows of ~20 bytes) and is a
    # quarter of the withheld text.
    engine = create_engine(sql_url)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO posts (id, body, kind) VALUES (:id, :body, 'big')"),
            [{"id": 10_001, "body": "w " * (4 << 20)}, {"id": 10_002, "body": "\u00e9" * 40_000}],
        )
    engine.dispose()
    limits = ReadLimits(max_doc_bytes=64 << 10)
    query = "SELECT id, body FROM posts WHERE id > 2400 ORDER BY id -- a trailing comment"
    with SqlSource(sql_url, query, limits) as source:
        assert source.count() == 103  # the comment does not swallow the count's wrapper either
        tracemalloc.start()
        try:
            docs = list(source.documents())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    by_id = {d.doc_id: d for d in docs}
    assert by_id["10001"].text is None and by_id["10001"].error == "text over --max-doc-bytes (64 KiB)"
    # 40,000 characters pass the database's length() but are 80,000 bytes in UTF-8: caught here
    assert by_id["10002"].text is None and by_id["10002"].error == "text over --max-doc-bytes (64 KiB)"
    assert by_id["2401"].text == "post number 2401" and len(docs) == 103
    assert peak < 2 << 20, peak


def test_sql_text_column_that_is_not_text_fails_before_scanning(pg_url):
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE nums (id INTEGER PRIMARY KEY, n INTEGER)"))
    engine.dispose()
    with pytest.raises(InputError, match="second column has no length.*must be text or bytes"):
        SqlSource(pg_url, "SELECT id, n FROM nums")


def test_sql_password_never_appears_in_the_source_label(pg_url):
    url = pg_url.replace("postgres@", "postgres:hunter2@")
    with SqlSource(url, "SELECT 1, 'x'") as source:
        assert "hunter2" not in source.label and "***" in source.label
