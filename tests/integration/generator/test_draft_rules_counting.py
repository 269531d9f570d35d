"""bench/draft_rules.py prices what a generation ran: its counting sessions must log every
forward that made logits, with the rows it really computed (queued committed tokens included),
and nothing for a call that ran no forward."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def draft_rules():
    sys.path.insert(0, str(BENCH))  # a script, not a package; it imports generate_speed beside it
    try:
        yield importlib.import_module("draft_rules")
    finally:
        sys.path.remove(str(BENCH))
        for name in ("draft_rules", "generate_speed"):
            sys.modules.pop(name, None)


def test_counting_session_logs_rows_of_each_forward(draft_rules, tiny_trio):
    target = tiny_trio()["target"]
    counted = draft_rules.CountingModel(target, "target")
    session = counted.session([5, 6, 7, 8])
    session.prefill()  # the prompt's prefill is not a logged forward
    assert counted.log == []
    session.extend([], [])  # the last prompt token: one row
    session.extend([-1, 0, -1], [9, 10, 11])  # a three-node tree over the cached root
    session.extend([], [])  # nothing new: no forward
    session.accept([0, 1], [12])  # path 9, 10 kept; 12 queued
    session.extend([-1], [13])  # the queued token plus one node
    assert counted.log == [("target", 1), ("target", 3), ("target", 2)]
    assert session.forwards == 3


def test_price_reads_the_table_and_extends_it_linearly(draft_rules):
    tables = {"target": {1: 10.0, 2: 12.0}, "drafter": {1: 2.0}}
    log = [("target", 1), ("target", 2), ("target", 4), ("drafter", 1), ("drafter", 3)]
    # 10 + 12 + 12 * 4 / 2 + 2 + 2 * 3 = 54 ms
    assert draft_rules.price(log, tables) == pytest.approx(0.054)
