"""The SQLite registry file: an empty file is refused (not adopted), a damaged one is one clear error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.db import make_engine
from wmark.keys.sqlite_file import RegistryDamagedError

runner = CliRunner()


def _config(home: Path) -> RegistryConfig:
    return RegistryConfig(home=home, database_url=f"sqlite:///{home / 'wmark.db'}")


def _one_line_exit_2(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    return result.stderr


def test_an_empty_file_is_refused_not_made_a_new_registry(_isolated_home):
    db = _isolated_home / "wmark.db"
    db.parent.mkdir(parents=True)
    db.touch()
    with pytest.raises(RegistryDamagedError, match=r"empty file \(0 bytes\).*rm "):
        KeyRegistry.open(_config(_isolated_home))
    message = _one_line_exit_2("keys", "list")
    assert "empty file" in message and "start a new" in message
    assert db.stat().st_size == 0  # left as it was found


@pytest.mark.parametrize("damage", ["not_a_database", "damaged_pages"])
def test_a_damaged_file_is_one_clear_error(_isolated_home, word_tokenizer_json, damage):
    db = _isolated_home / "wmark.db"
    with KeyRegistry.open(_config(_isolated_home)) as registry:
        ref = registry.add_tokenizer(word_tokenizer_json, "words")
        key_id = registry.create_key("k", ref).key_id
    if damage == "not_a_database":
        db.write_bytes(bytes(range(256)) * 32)
    else:  # the keys table's pages overwritten: the header and schema still read
        with sqlite3.connect(db) as conn:
            (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'keys'").fetchone()
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        conn.close()
        with db.open("r+b") as fh:
            fh.seek((root - 1) * page_size)
            fh.write(b"\xa5" * page_size)
    config = _config(_isolated_home)
    with pytest.raises(RegistryDamagedError, match="is damaged"), KeyRegistry.open(config) as registry:
        registry.list_keys()
    for args in (("keys", "list"), ("keys", "show", key_id)):
        assert "is damaged" in _one_line_exit_2(*args)


def test_a_new_registry_file_is_never_seen_empty(tmp_path):
    db = tmp_path / "sub" / "new.db"
    engine = make_engine(f"sqlite:///{db}")
    with engine.connect():
        pass
    engine.dispose()
    assert db.stat().st_size > 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    assert [p.name for p in db.parent.iterdir() if p.name.endswith(".new")] == []  # no staging left


def test_a_registry_that_lost_its_schema_version_is_one_clear_error(_isolated_home):
    KeyRegistry.open(_config(_isolated_home)).close()
    with sqlite3.connect(_isolated_home / "wmark.db") as conn:
        conn.execute("DELETE FROM alembic_version")  # what damage to that one page looks like
    conn.close()
    assert "migrating the registry database failed" in _one_line_exit_2("keys", "list")
