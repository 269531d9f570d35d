"""The evaluation runner on a fake LM: the settings grid, rows and their figures against direct
computations, crash-safe results files, and run-level settings pinned across reruns."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import InputError
from wmark.eval.aggregate import ablation_groups
from wmark.eval.prompts import Prompt
from wmark.eval.results import ResultsFile
from wmark.eval.rows import EvalRow
from wmark.eval.runner import (
    EvalModels,
    Job,
    RunInfo,
    Setting,
    expand_settings,
    plan_jobs,
    run_job,
)
from wmark.generator.fakes import FakeLM
from wmark.scoring import score_pivots

P = np.array([0.30, 0.25, 0.15, 0.12, 0.10, 0.05, 0.03])
Q = np.array([0.10, 0.35, 0.05, 0.25, 0.05, 0.05, 0.15])
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="0" * 64, vocab_size=len(P)))
KEY = KeyMaterial(key_id="wk_fake", secret=Secret(hashlib.sha256(b"runner").digest()), spec=SPEC)
INFO = RunInfo(
    target="fake",
    key_id=KEY.key_id,
    key_fingerprint=KEY.secret.fingerprint(),
    max_new_tokens=40,
    temperature=1.0,
    top_k=50,
    top_p=1.0,
    diversity_bits=0.0,
    default_drafter="fake-drafter",
    default_draft_temperature=1.0,
    prompts="test",
    spec=SPEC.to_json(),
)


def _models() -> EvalModels:
    return EvalModels(
        target=FakeLM.fixed(P),
        drafters={"fake-drafter": FakeLM.fixed(Q)},
        encode=lambda prompt: [int(x) for x in (prompt.prompt or "").split()],
        encode_text=lambda text: [int(x) for x in text.split()],
        decode=lambda ids: " ".join(map(str, ids)),
    )


PROMPT = Prompt("p1", prompt="1 2 3 4 5 6", reference="0 1 2 3 0 1")


def test_settings_grid():
    settings = expand_settings(
        ["basic-uwm", "pfr", "mpfr", "gls", "pfr"],
        lookaheads=[1, 4],
        multi_lookaheads=[4],
        drafts=[2, 8],
        drafters=["d1", "d2"],
        draft_temperatures=[1.0, 0.5],
    )
    keys = [s.key for s in settings]
    assert len(keys) == len(set(keys)) == 1 + 2 * 4 + 2 * 4 + 2 * 4  # basic-uwm once, pfr once
    assert Setting(method="basic-uwm") in settings
    assert {(s.lookahead, s.drafts) for s in settings if s.method == "mpfr"} == {(4, 2), (4, 8)}
    assert {(s.lookahead, s.drafts) for s in settings if s.method == "pfr"} == {(1, 1), (4, 1)}
    with pytest.raises(
        InputError, match="unknown method 'nope'; known: basic-uwm, pfr, pfr-nowm, mpfr, vsps"
    ):
        expand_settings(
            ["pfr", "nope"],
            lookaheads=[1],
            multi_lookaheads=[1],
            drafts=[2],
            drafters=["d"],
            draft_temperatures=[1.0],
        )


def test_invalid_setting_values_fail_before_any_model_runs():
    with pytest.raises(InputError, match="lookahead must be in"):
        Setting(method="pfr", lookahead=0, drafter="d", draft_temperature=1.0).sampler(INFO)
    with pytest.raises(InputError, match="drafts must be in"):
        Setting(method="mpfr", lookahead=4, drafts=99, drafter="d", draft_temperature=1.0).sampler(INFO)


@functools.cache
def _pfr_row() -> EvalRow:
    job = Job(PROMPT, Setting(method="pfr", lookahead=3, drafter="fake-drafter", draft_temperature=1.0), 0)
    return run_job(job, models=_models(), key=KEY, info=INFO)


def _row(row_id: str) -> EvalRow:
    """A real row of the fake models, renamed: the results file and the ablation need only ids."""
    return dataclasses.replace(_pfr_row(), row_id=row_id, prompt_key=row_id)


def test_row_figures_match_direct_computations():
    models = _models()
    rows = {
        m: run_job(Job(PROMPT, s, 0), models=models, key=KEY, info=INFO)
        for m, s in {
            "basic-uwm": Setting(method="basic-uwm"),
            "pfr": Setting(method="pfr", lookahead=3, drafter="fake-drafter", draft_temperature=1.0),
            "mse": Setting(method="mse", lookahead=3, drafter="fake-drafter", draft_temperature=1.0),
        }.items()
    }
    pfr = rows["pfr"]
    assert pfr.token_ids == rows["basic-uwm"].token_ids  # same key and request seed: same text
    assert pfr.aatps == pytest.approx(pfr.n_tokens / len(pfr.blocks))
    assert pfr.target_forwards == len(pfr.blocks) and sum(pfr.blocks) == pfr.n_tokens == 40
    # LPPL under the known P, ROUGE-L against the reference, pivots scored by the core
    expected_lppl = float(np.mean([-math.log(P[t]) for t in pfr.token_ids]))
    assert pfr.lppl == pytest.approx(expected_lppl) and pfr.lppl_dropped == 0
    assert 0.0 < pfr.rouge_l <= 1.0
    assert pfr.log_p["aaronson"] == score_pivots(np.array(pfr.pivots), "aaronson").log_p
    assert pfr.n_scored == len(pfr.scored_positions) == 40 - len(pfr.masked_positions)
    assert pfr.prompt_tail == [1, 2, 3, 4, 5, 6] and pfr.keyed is True
    assert rows["mse"].token_ids != pfr.token_ids
    json.dumps({m: r.to_json() for m, r in rows.items()})  # every row is JSON-ready


def test_request_seed_is_shared_by_methods_and_differs_by_prompt_and_seed():
    pfr = Setting(method="pfr", lookahead=3, drafter="d", draft_temperature=1.0)
    jobs = plan_jobs([PROMPT, Prompt("p2", prompt="4 5 6")], [Setting(method="basic-uwm"), pfr], [0, 1])
    assert len(jobs) == 8 and len({j.row_id for j in jobs}) == 8
    seeds = {(j.prompt.id, j.seed, j.setting.method): j.request_seed for j in jobs}
    assert seeds[("p1", 0, "pfr")] == seeds[("p1", 0, "basic-uwm")]
    assert len({seeds[("p1", 0, "pfr")], seeds[("p2", 0, "pfr")], seeds[("p1", 1, "pfr")]}) == 3
    changed = Job(dataclasses.replace(PROMPT, prompt="1 2 3"), pfr, 0)
    assert changed.row_id != Job(PROMPT, pfr, 0).row_id  # a changed prompt is not reused


def test_results_file_survives_a_torn_line(tmp_path: Path):
    results = ResultsFile(tmp_path / "results.jsonl")
    assert results.load() == []
    results.append(_row("a"))
    results.append(_row("b"))
    with results.path.open("a") as f:
        f.write(json.dumps(_row("c").to_json())[:40])  # a crash in the middle of an append
    torn = results.path.read_bytes()
    assert [r.row_id for r in results.load()] == ["a", "b"]
    assert results.path.read_bytes() == torn  # a reader never modifies the file
    assert [r.row_id for r in results.load(repair=True)] == ["a", "b"]
    assert results.path.read_text().endswith("}\n")  # the writer cuts the torn tail off
    results.append(_row("c"))
    assert [r.row_id for r in results.load()] == ["a", "b", "c"]


def test_one_writer_per_folder(tmp_path: Path):
    results = ResultsFile(tmp_path / "results.jsonl")
    script = (
        "import sys; from pathlib import Path; from wmark.eval.results import ResultsFile; "
        "from wmark.errors import InputError\n"
        "try:\n    ResultsFile(Path(sys.argv[1])).locked().__enter__()\nexcept InputError as e:\n    print(e)"
    )
    with results.locked():
        out = subprocess.run(
            [sys.executable, "-c", script, str(results.path)], capture_output=True, text=True
        )
    assert "another wmark eval is writing to" in out.stdout
    again = subprocess.run([sys.executable, "-c", script, str(results.path)], capture_output=True, text=True)
    assert again.stdout == ""  # released


def test_results_file_refuses_a_corrupt_middle_line(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    path.write_text(f"{json.dumps(_row('a').to_json())}\nnot json\n{json.dumps(_row('b').to_json())}\n")
    with pytest.raises(InputError, match="line 2: not valid JSON"):
        ResultsFile(path).load()


def test_run_info_pins_run_level_settings(tmp_path: Path):
    INFO.save(tmp_path / "run.json")
    stored = RunInfo.load(tmp_path / "run.json")
    assert stored == INFO
    INFO.check_compatible(dataclasses.replace(stored, default_drafter="other"), tmp_path)  # may differ
    with pytest.raises(InputError, match="max_new_tokens=40, not 64"):
        dataclasses.replace(INFO, max_new_tokens=64).check_compatible(stored, tmp_path)
    with pytest.raises(InputError, match="prompt_template='chat', not 'hu-huang'"):
        dataclasses.replace(INFO, prompt_template="hu-huang").check_compatible(stored, tmp_path)
    # a run.json from before the template existed reads as the chat template
    old = json.loads((tmp_path / "run.json").read_text())
    del old["prompt_template"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert RunInfo.load(tmp_path / "old.json") == INFO
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not a wmark eval run"):
        RunInfo.load(tmp_path / "bad.json")


def test_drafter_ablation_compares_conditions_on_the_same_texts():
    def row(prompt: str, drafter: str | None, temperature: float | None) -> EvalRow:
        return dataclasses.replace(
            _row(prompt), method="pfr", lookahead=4, drafter=drafter, draft_temperature=temperature
        )

    rows = [row(p, "embedded", 1.0) for p in "abcde"]  # the default drafter ran 5 prompts
    rows += [row(p, "embedded", 0.5) for p in "abc"]  # the ablation 3 of them
    rows += [row(p, "target", 1.0) for p in "bcd"]
    rows += [row(p, None, None) for p in "abcde"]  # basic-uwm: no drafter, not in the ablation
    groups = ablation_groups(rows)
    assert list(groups) == [("pfr", 4, 1)]
    conditions = groups[("pfr", 4, 1)]
    assert set(conditions) == {("embedded", 1.0), ("embedded", 0.5), ("target", 1.0)}
    for kept in conditions.values():
        assert sorted(r.prompt_key for r in kept) == ["b", "c"]
