"""paraphrases.jsonl: a paraphrase is made once per (source, generator state, context), kept
across runs, and the model is built only at the first paraphrase the file lacks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from wmark.eval.paraphrase import Paraphrase, ParaphraseCache


class Maker:
    """Counts model loads and paraphrases; the paraphrase echoes the source and one draw."""

    def __init__(self) -> None:
        self.loads = 0
        self.made = 0

    def __call__(self):
        self.loads += 1

        def paraphrase(ids: Sequence[int], rng: np.random.Generator) -> Paraphrase:
            self.made += 1
            draw = int(rng.integers(1000))
            return Paraphrase(f"{list(ids)} {draw}", (*ids, draw), 0.5)

        return paraphrase


def test_paraphrases_are_made_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "paraphrases.jsonl"
    maker = Maker()
    cache = ParaphraseCache(path, "ctx", maker)
    first = cache([1, 2, 3], np.random.default_rng(7))
    assert maker.loads == maker.made == 1
    assert cache([1, 2, 3], np.random.default_rng(7)) == first and maker.made == 1
    other_seed = cache([1, 2, 3], np.random.default_rng(8))
    other_text = cache([1, 2], np.random.default_rng(7))
    assert maker.loads == 1 and maker.made == 3 and len({first, other_seed, other_text}) == 3

    with path.open("a") as f:
        f.write('{"key": "torn", "te')  # a crash mid-append: skipped on reading
    again = Maker()
    reread = ParaphraseCache(path, "ctx", again)
    assert reread([1, 2, 3], np.random.default_rng(7)) == first
    assert reread([1, 2], np.random.default_rng(7)) == other_text
    assert again.loads == again.made == 0  # everything came from the file: no model
    elsewhere = ParaphraseCache(path, "another model", again)
    assert elsewhere([1, 2, 3], np.random.default_rng(7)) == first  # same fake, same draw
    assert again.loads == again.made == 1  # but made anew: another context is another key
    # the entry appended after the torn line is on a line of its own
    last = Maker()
    assert ParaphraseCache(path, "another model", last)([1, 2, 3], np.random.default_rng(7)) == first
    assert last.made == 0
