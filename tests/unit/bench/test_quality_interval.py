"""bench/quality.py's perplexity-ratio interval: whole texts resampled, not positions."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "quality.py"


def _quality():
    spec = importlib.util.spec_from_file_location("wmark_bench_quality", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, str(SCRIPT.parent))  # a script, not a package: it imports bench/machine.py beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def _row(quality, gaps_per_text: list[list[float]]):
    """A Row whose text i has the per-position NLL gaps (row minus float) `gaps_per_text[i]`."""
    row = quality.Row()
    for index, gaps in enumerate(gaps_per_text):
        row.text += [index] * len(gaps)
        row.nll += [2.0 + g for g in gaps]
        row.reference_nll += [2.0] * len(gaps)
    return row


def test_equal_texts_give_an_interval_of_one_point():
    quality = _quality()
    row = _row(quality, [[0.01] * 5 for _ in range(6)])
    low, high = row.ratio_interval()
    assert math.isclose(low, math.exp(0.01), rel_tol=1e-12) and math.isclose(high, low, rel_tol=1e-12)


def test_texts_move_as_wholes():
    """Two texts of 10 positions, gaps 0.1 and 0: a draw holds each text 0, 1 or 2 times, so the
    ratio is exp(0), exp(0.05) or exp(0.1), each extreme with probability 1/4. In 2,000 draws
    the 2.5th and 97.5th percentiles are the extremes (fewer than 50 draws of either has
    probability ~1e-60). Resampling positions instead would have put them near exp(0.05 +- 0.02)."""
    quality = _quality()
    row = _row(quality, [[0.1] * 10, [0.0] * 10])
    low, high = row.ratio_interval()
    assert math.isclose(low, 1.0, rel_tol=1e-12), low
    assert math.isclose(high, math.exp(0.1), rel_tol=1e-12), high


def test_the_interval_holds_the_ratio_and_narrows_with_more_texts():
    quality = _quality()
    rng = np.random.default_rng(3)
    widths = []
    for texts in (8, 128):
        # each text's gap has its own offset (texts differ), plus noise per position
        gaps = [list(rng.normal(rng.normal(0.003, 0.01), 0.05, size=50)) for _ in range(texts)]
        row = _row(quality, gaps)
        ratio = math.exp(np.mean(row.nll) - np.mean(row.reference_nll))
        low, high = row.ratio_interval()
        assert low <= ratio <= high, (texts, low, ratio, high)
        widths.append(high - low)
    # 16x the texts: the width shrinks ~4x (1/sqrt of the count); 2x is far outside the
    # bootstrap's spread at these sizes
    assert widths[1] * 2 < widths[0], widths


def test_the_summary_prints_the_interval():
    quality = _quality()
    row = quality.Row()
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 64, generator=gen, dtype=torch.float64)  # the top-50 check needs 50+ tokens
    ref = torch.log_softmax(logits, -1)
    other = torch.log_softmax(logits + 0.1 * torch.randn(2, 64, generator=gen, dtype=torch.float64), -1)
    row.add(ref, other, torch.tensor([0, 2]), 0)
    row.add(ref, other, torch.tensor([1, 1]), 1)
    cells = row.summary().split(" | ")
    assert cells[3].count("[") == 1 and cells[3].endswith("]"), cells
    assert row.text == [0, 0, 1, 1]
