"""`wmark eval` end to end on tiny model directories built here: rows, summary tables and plots;
resuming (rerun skips finished rows, a crash loses nothing, a killed run completes without
duplicates); the drafter ablation; and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, word_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"p{i}",
                    "prompt": " ".join(f"w{j}" for j in range(9 * i, 9 * i + 12)),
                    "reference": " ".join(f"w{j}" for j in range(5, 40)),
                }
            )
            + "\n"
            for i in range(2)
        )
    )
    return {
        "target": word_model_dir(root / "target", 0),
        "drafter": word_model_dir(root / "drafter", 1),
        "prompts": prompts,
    }


def _args(dirs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--out",
        str(out),
        "--prompts",
        str(dirs["prompts"]),
        "--target",
        str(dirs["target"]),
        "--drafter",
        str(dirs["drafter"]),
        "--raw",
        "--precision",
        "exact-fp32",
        "--max-new-tokens",
        "16",
        *extra,
    ]


def _rows(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


GRID = ["--methods", "basic-uwm,vsps,pfr,mse,mse-pseudo,mpfr,gls", "--lookahead", "1,2", "--drafts", "2,3"]


def test_eval_writes_rows_tables_and_plots_and_resumes(dirs, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, _args(dirs, out, *GRID))
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    # per prompt: basic-uwm 1 + (vsps, pfr, mse, mse-pseudo) x L{1,2} 8 + (mpfr, gls) x L=2 x B{2,3} 4
    assert len(rows) == 2 * 13 and len({r["row_id"] for r in rows}) == 26
    for r in rows:
        assert r["target_forwards"] == len(r["blocks"]) and sum(r["blocks"]) == r["n_tokens"] == 16
        assert r["rouge_l"] is not None and r["lppl"] > 0
    by = {(r["prompt_id"], r["method"], r["lookahead"], r["drafts"]): r for r in rows}
    for pid in ("p0", "p1"):  # one key and request seed per prompt: the race methods emit one text
        assert by[(pid, "pfr", 1, 1)]["token_ids"] == by[(pid, "basic-uwm", None, 1)]["token_ids"]
        assert by[(pid, "mpfr", 2, 3)]["token_ids"] == by[(pid, "basic-uwm", None, 1)]["token_ids"]
    summary = (out / "summary.md").read_text()
    for heading in (
        "## Single draft (per L)",
        "### L = 1",
        "## Multi-draft: MPFR vs GLS (Table 1 shape)",
        "## TPR at 1% FPR vs evaluated tokens",
        "### TPR at 1% FPR: analytic / empirical on the run's 8 unwatermarked texts / empirical on no "
        "corpus given",
        "## Calibration under H0",
        "## mse-pseudo detector: tau",
        "## Hu & Huang's pooled conventions",
        "| mse-pseudo [k1 only] |",
        "| vsps † |",
    ):
        assert heading in summary, heading
    assert "## Drafter substitution" not in summary  # one drafter condition only
    for png in ("frontier.png", "multidraft.png", "tpr.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not (out / "drafters.png").exists()
    run = json.loads((out / "run.json").read_text())
    assert run["max_new_tokens"] == 16 and run["spec"]

    # Rerun: nothing left to generate, no model is loaded, the rows are untouched.
    before = (out / "results.jsonl").read_bytes()
    start = time.perf_counter()
    again = runner.invoke(app, _args(dirs, out, *GRID))
    assert again.exit_code == 0, again.output
    assert (out / "results.jsonl").read_bytes() == before and time.perf_counter() - start < 30
    # More settings: only the new rows run.
    more = runner.invoke(app, _args(dirs, out, "--methods", "pfr,mws", "--lookahead", "2"))
    assert more.exit_code == 0, more.output
    assert len(_rows(out)) == 26 + 2  # mws at L=2 for two prompts; pfr L=2 was there
    # A torn last line (crash mid-append) is cut and its row generated again.
    data = (out / "results.jsonl").read_bytes()
    (out / "results.jsonl").write_bytes(data[: len(data) - 40])
    assert len(runner.invoke(app, _args(dirs, out, "--methods", "pfr,mws", "--lookahead", "2")).output) >= 0
    rows = _rows(out)
    assert len(rows) == 28 and len({r["row_id"] for r in rows}) == 28
    # --summary-only rebuilds the outputs from the rows alone.
    (out / "summary.md").unlink()
    only = runner.invoke(app, [*_args(dirs, out), "--summary-only", "--no-plots"])
    assert only.exit_code == 0 and "## Single draft" in (out / "summary.md").read_text()


def test_a_killed_run_resumes_without_loss_or_duplicates(dirs, tmp_path):
    out = tmp_path / "killed"
    args = _args(dirs, out, "--methods", "pfr,mse,gls", "--lookahead", "2", "--drafts", "2", "--no-plots")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wmark.cli", *args], env=env, stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not results.exists() or results.read_text().count("\n") < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = results.read_text().count("\n")
    assert 2 <= done < 6  # it was killed part-way through
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 6 and len({r["row_id"] for r in rows}) == 6


def test_drafter_ablation_reports_text_drift(dirs, tmp_path):
    out = tmp_path / "ablation"
    args = _args(dirs, out, "--methods", "pfr,mpfr,mse", "--lookahead", "2", "--drafts", "2")
    args += ["--drafter", f"{dirs['drafter']},target", "--draft-temperature", "1,0.5"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert "## Drafter substitution" in summary and (out / "drafters.png").exists()
    ablation = summary.split("## Drafter substitution")[1].split("\n## ")[0]
    lines = [line for line in ablation.splitlines() if line.startswith(("| pfr (L=2)", "| mpfr (L=2, B=2)"))]
    assert len(lines) == 8  # 2 methods x 4 drafter conditions
    assert all(cells.split("|")[-3].strip() in ("(default)", "2/2") for cells in lines)  # text never changes
    rows = _rows(out)
    assert {r["drafter"] for r in rows} == {str(dirs["drafter"]), "target"}
    target_drafted = [r for r in rows if r["drafter"] == "target" and r["draft_temperature"] == 1.0]
    # P == Q: every draft is accepted, each block is L + 1 tokens (the last one cut by the budget)
    assert all(set(r["blocks"][:-1]) == {3} for r in target_drafted if r["method"] == "pfr")


def test_model_free_drafters_in_the_ablation(dirs, tmp_path):
    out = tmp_path / "ngram"
    args = _args(dirs, out, "--methods", "pfr,mpfr", "--lookahead", "2", "--drafts", "2")
    args += ["--drafter", f"{dirs['drafter']},ngram,auto"]  # auto: lookup alone (not the embedded target)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert {r["drafter"] for r in rows} == {str(dirs["drafter"]), "ngram", "auto"}
    for r in rows:
        if r["drafter"] in ("ngram", "auto"):
            assert r["draft_forwards"] == 0
    by_setting: dict[tuple[object, ...], set[tuple[int, ...]]] = {}
    for r in rows:  # the same text under every drafter
        by_setting.setdefault((r["method"], r["prompt_key"], r["seed"]), set()).add(tuple(r["token_ids"]))
    assert all(len(texts) == 1 for texts in by_setting.values())


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--methods", "pfr,nope"], "unknown method 'nope'; known: basic-uwm, pfr, pfr-nowm, mpfr, vsps"),
        (["--lookahead", "x"], "--lookahead: expected comma-separated integers"),
        (["--lookahead", "0"], "lookahead must be in"),
        (["--drafts", "99"], "drafts must be in"),
        (["--draft-temperature", "0"], "temperature must be > 0"),
        (["--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(dirs, tmp_path, extra, message):
    result = runner.invoke(app, _args(dirs, tmp_path / "bad", *extra))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "bad" / "results.jsonl").exists()


def test_malformed_prompt_file_names_the_line(dirs, tmp_path):
    prompts = tmp_path / "broken.jsonl"
    prompts.write_text('{"id": "ok", "prompt": "w1 w2"}\n{"id": "bad", "prompt": \n')
    result = runner.invoke(app, [*_args(dirs, tmp_path / "out"), "--prompts", str(prompts)])
    assert result.exit_code == 2
    assert f"{prompts}, line 2: not valid JSON" in " ".join(result.output.split())


def test_resuming_with_other_run_settings_is_refused(dirs, tmp_path):
    out = tmp_path / "pinned"
    assert runner.invoke(app, _args(dirs, out, "--methods", "basic-uwm", "--no-plots")).exit_code == 0
    result = runner.invoke(app, [*_args(dirs, out, "--methods", "basic-uwm"), "--max-new-tokens", "20"])
    assert result.exit_code == 2 and "max_new_tokens=16, not 20" in " ".join(result.output.split())
    empty = runner.invoke(app, [*_args(dirs, tmp_path / "empty"), "--summary-only"])
    assert empty.exit_code == 2 and "no results yet" in empty.output


def test_attacks_write_rows_table_and_plot(dirs, tmp_path):
    """Each answer (cut to 8 and 16 tokens) under each attack: a zero-width space after every
    space costs nothing (the marks choose the canonical reading), and the unwatermarked rows are
    attacked too (their FPR column)."""
    import math

    from wmark.detector.normalize import canonical_text

    out = tmp_path / "robust"
    attacks = "zero-width-100,homoglyph-100,delete-10,paste-50"
    args = _args(dirs, out, "--methods", "pfr,pfr-nowm", "--lookahead", "1")
    result = runner.invoke(app, [*args, "--attacks", attacks, "--attack-lengths", "8,16"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "attacks.jsonl").read_text().splitlines()]
    # 2 prompts x 2 methods x 2 lengths x (none + 4 attacks)
    assert len(rows) == 2 * 2 * 2 * 5
    by = {(r["row_id"], r["tokens"], r["attack"]): r for r in rows}
    exact = 0
    for (row_id, tokens, attack), r in by.items():
        if attack == "zero-width-100":
            clean = by[(row_id, tokens, "none")]
            assert "\u200b" in r["text"]
            if canonical_text(clean["text"]) == clean["text"]:
                # the zero-width spaces are edit marks: the canonical reading alone, which is the
                # clean text, so exactly its p-value (no Bonferroni factor)
                assert math.isclose(r["log_p"], clean["log_p"], rel_tol=1e-9, abs_tol=1e-12)
                exact += 1
        if attack == "paste-50":
            assert by[(row_id, tokens, "none")]["text"] in r["text"]
    assert exact > 0
    assert {r["keyed"] for r in rows} == {True, False}
    table = (out / "attacks.md").read_text()
    for name in ("| none |", "| zero-width-100 | char |", "| delete-10 | word |", "| paste-50 | span |"):
        assert name in table
    assert (out / "attacks.png").read_bytes()[:4] == b"\x89PNG"


def test_paraphrase_negatives_and_summary_only(dirs, tmp_path):
    """The paraphrase attack for the first watermarked generation only (--paraphrase-limit 1), at
    both lengths, with its ROUGE-L; a negative corpus's thresholds beside the analytic and the
    run's own in summary.md and attacks.md; then --summary-only on the folder reuses the kept
    paraphrases without a model, and without them loads the model and, seeded, writes the same
    rows."""
    rng = np.random.default_rng(8)
    negatives = tmp_path / "human.txt"  # 120 word documents of 24 words: at least T = 16 tokens each
    negatives.write_text("\n".join(" ".join(f"w{i}" for i in rng.integers(0, 200, 24)) for _ in range(120)))
    out = tmp_path / "para"
    args = _args(dirs, out, "--methods", "pfr,pfr-nowm", "--lookahead", "1", "--attack-lengths", "8,16")
    more = ["--attacks", "delete-10,model", "--paraphrase-limit", "1", "--negatives", str(negatives)]
    result = runner.invoke(app, [*args, *more])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "attacks.jsonl").read_text().splitlines()]
    para = [r for r in rows if r["attack"] == "paraphrase"]
    first_keyed = next(r for r in _rows(out) if r["keyed"])["row_id"]
    assert {(r["row_id"], r["tokens"]) for r in para} == {(first_keyed, 8), (first_keyed, 16)}
    assert all(r["level"] == "model" and 0.0 <= r["rouge_l"] <= 1.0 for r in para)
    assert all(r["rouge_l"] is None for r in rows if r["attack"] != "paraphrase")
    # 2 prompts x 2 methods x 2 lengths x (none, delete-10) + the 2 paraphrases
    assert len(rows) == 2 * 2 * 2 * 2 + 2
    table = (out / "attacks.md").read_text()
    assert "| paraphrase | model | 1 |" in table and "median ROUGE-L" in table
    assert (
        f"corpus {negatives} (120 documents)" in table
        and "| negatives n | – / 2 / 120 | – / 2 / 120 |" in table
    )
    summary = (out / "summary.md").read_text()
    assert f"empirical on the corpus {negatives}" in summary
    assert "| negatives | | – / 2 / 120 |" in summary  # the run's 2 pfr-nowm answers, the corpus's 120

    assert len((out / "paraphrases.jsonl").read_text().splitlines()) == 2

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    import wmark.eval.models

    with pytest.MonkeyPatch.context() as patch:  # kept paraphrases: no model is loaded
        patch.setattr(wmark.eval.models, "load_models", no_model)
        again = runner.invoke(app, [*args, "--summary-only", *more])
    assert again.exit_code == 0, again.output
    assert [json.loads(line) for line in (out / "attacks.jsonl").read_text().splitlines()] == rows
    (out / "paraphrases.jsonl").unlink()  # made again from the model: seeded, the same rows
    fresh = runner.invoke(app, [*args, "--summary-only", *more])
    assert fresh.exit_code == 0, fresh.output
    assert [json.loads(line) for line in (out / "attacks.jsonl").read_text().splitlines()] == rows


def test_prompt_template_and_negatives_errors(dirs, tmp_path):
    bad = runner.invoke(app, _args(dirs, tmp_path / "t", "--methods", "pfr", "--prompt-template", "hu-huang"))
    assert bad.exit_code == 2 and "applies to cnn_dailymail:PATH prompts only" in bad.output
    few = tmp_path / "few.txt"
    few.write_text("w1 w2\n" * 10)
    small = runner.invoke(app, _args(dirs, tmp_path / "n", "--methods", "pfr", "--negatives", str(few)))
    assert small.exit_code == 2 and "at least 100" in " ".join(small.output.split())
