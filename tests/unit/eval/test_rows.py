"""results.jsonl rows as `EvalRow`: rows written before the type existed load and write back
byte for byte, unknown (newer) fields survive a round trip, and a field added with a default
leaves old rows loadable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from wmark.errors import InputError
from wmark.eval.results import ResultsFile
from wmark.eval.rows import EvalRow

# A row as `wmark eval` wrote it before EvalRow existed (run_job returned a dict; same fields,
# same order, compact separators), shortened to a 3-token text.
OLD_LINE = (
    '{"row_id":"p0#0123456789ab|pfr|L2|B1|d|T1.0|s0","prompt_id":"p0","prompt_key":"p0#0123456789ab",'
    '"method":"pfr","lookahead":2,"drafts":1,"drafter":"d","draft_temperature":1.0,"seed":0,'
    '"request_seed":123456789,"keyed":true,"prompt_len":5,"prompt_tail":[3,4,5,6,7],'
    '"token_ids":[8,9,10],"text":"w8 w9 w10","n_tokens":3,"stop_reason":"length","blocks":[2,1],'
    '"drafted":[2,2],"masked_positions":[],"diverse_positions":[],"target_forwards":2,"draft_forwards":4,'
    '"aatps":1.5,"tokens_per_s":30.0,"timings":{"draft":0.01,"verify":0.02,"bookkeeping":0.001},'
    '"scored_positions":[0,1,2],"pivots":[0.1,0.2,0.3],"pivots_k2":[0.4,0.5,0.6],'
    '"r_k2":[0.7,0.8,0.9],"n_scored":3,"log_p":{"u":-1.0,"aaronson":-1.1,"li":-0.9,"pl":-0.8},'
    '"log_p_pseudo":{"u":-0.5,"aaronson":-0.6,"li":-0.4,"pl":-0.3},"lppl":2.5,"lppl_dropped":0,'
    '"rouge_l":null}'
)


def test_an_old_row_loads_and_writes_back_unchanged(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    path.write_text(OLD_LINE + "\n")
    results = ResultsFile(path)
    (row,) = results.load()
    assert row.method == "pfr" and row.lookahead == 2 and row.rouge_l is None
    assert row.log_p["aaronson"] == -1.1 and row.timings["verify"] == 0.02 and row.extra == {}
    results.append(row)
    first, second = path.read_text().splitlines()
    assert second == first == OLD_LINE  # same fields, same order, same separators


def test_unknown_fields_survive_a_round_trip():
    data = {**json.loads(OLD_LINE), "attack": "delete-10%", "attack_params": {"rate": 0.1}}
    row = EvalRow.from_json(data)
    assert row.extra == {"attack": "delete-10%", "attack_params": {"rate": 0.1}}
    assert json.dumps(row.to_json()) == json.dumps(data)


def test_a_field_added_with_a_default_leaves_old_rows_loadable():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class AttackedRow(EvalRow):  # how a later field (a robustness table's attack) is added
        attack: str | None = None

    old = AttackedRow.from_json(json.loads(OLD_LINE))
    assert old.attack is None and old.row_id.startswith("p0#")
    new = AttackedRow.from_json({**json.loads(OLD_LINE), "attack": "swap"})
    assert new.attack == "swap" and new.extra == {}
    assert list(new.to_json())[-1] == "attack"  # new fields follow the existing ones


def test_a_line_that_is_not_a_row_is_refused_with_its_number(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    partial = {k: v for k, v in json.loads(OLD_LINE).items() if k not in ("token_ids", "lppl")}
    path.write_text(OLD_LINE + "\n" + json.dumps(partial) + "\n")
    with pytest.raises(InputError, match=r"line 2: not a wmark eval row: no token_ids, lppl"):
        ResultsFile(path).load()
    path.write_text(OLD_LINE + "\n[1, 2]\n")
    with pytest.raises(InputError, match="line 2: not a wmark eval row"):
        ResultsFile(path).load()
