"""`wmark detect --generation` on hostile JSON: a clear one-line error and exit code 2, never a
traceback (the record is read before any key or registry is needed)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from wmark.cli.main import app

runner = CliRunner()


def test_deeply_nested_json_is_one_line_and_exit_2(tmp_path: Path):
    record = tmp_path / "deep.json"
    record.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    result = runner.invoke(app, ["detect", "--generation", str(record)])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "nested too deeply" in lines[0], result.output
    assert "Traceback" not in result.output
