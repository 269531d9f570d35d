"""Fixtures of the command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app


@pytest.fixture()
def key_id(tmp_path: Path, word_tokenizer_json: bytes) -> str:
    """A key made with `wmark keys create` over the tests' word tokenizer (the registry is the
    test's WMARK_HOME)."""
    path = tmp_path / "tokenizer.json"
    path.write_bytes(word_tokenizer_json)
    result = CliRunner().invoke(
        app, ["keys", "create", "test-key", "--tokenizer", str(path)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.stdout.strip()
