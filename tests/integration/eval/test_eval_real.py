"""`wmark eval` on the embedded pair for real (slow: minutes on a CPU; `make test-slow`).

One ELI5 prompt, 48 tokens: pfr and mpfr emit basic-uwm's text exactly (batch-invariant int8),
every baseline runs one target forward per block, the watermarked texts are detected and the
summary holds the multi-draft table. BENCHMARKS.md has the full run (bench/eval_embedded.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app

pytestmark = [pytest.mark.slow, pytest.mark.models]
runner = CliRunner()


def test_eval_on_the_embedded_pair(tmp_path: Path):
    out = tmp_path / "real"
    args = ["eval", "--out", str(out), "--prompts", "eli5-mini", "--limit", "1", "--max-new-tokens", "48"]
    args += ["--methods", "basic-uwm,pfr,mse,mpfr,gls", "--lookahead", "4", "--drafts", "2", "--no-plots"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"basic-uwm", "pfr", "mse", "mpfr", "gls"}
    for method in ("pfr", "mpfr"):
        assert rows[method]["token_ids"] == rows["basic-uwm"]["token_ids"]
        assert rows[method]["aatps"] > 1.0
    for row in rows.values():
        assert row["target_forwards"] == len(row["blocks"]) and row["n_tokens"] == 48
    assert rows["pfr"]["log_p"]["aaronson"] < math.log(0.01)  # detected at 1% from 48 tokens
    summary = (out / "summary.md").read_text()
    assert "## Multi-draft: MPFR vs GLS" in summary and "| 2 |" in summary
