"""One line of results.jsonl as a typed, frozen record.

The JSON shape is the contract (summaries are rebuilt from old folders, and bench/ reads them),
so `EvalRow.to_json()` writes exactly the fields, in the order, that rows have always had, and
`EvalRow.from_json()` reads any row written since results.jsonl existed.

Adding a field: give it a default (None, or an empty container through `field(default_factory=...)`)
and put it after the existing ones. Rows written before it existed then load with the default, and
rows written by a newer wmark keep the fields this version does not know in `extra`, which
`to_json()` writes back, so a file that several versions append to loses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wmark.errors import InputError
from wmark.scoring import ScoreName

__all__ = ["EvalRow"]


@dataclass(frozen=True, kw_only=True)
class EvalRow:
    """The raw figures of one generation (`wmark.eval.runner.run_job`).

    Attributes:
        row_id: prompt key, setting key and seed (`Job.row_id`); unique within a folder.
        prompt_id / prompt_key: the prompt's id, and its id with a content hash.
        method, lookahead, drafts, drafter, draft_temperature: the setting (None where the method
            drafts nothing).
        seed / request_seed: the run seed and the generation's request seed derived from it.
        keyed: whether the method carries the watermark.
        prompt_len / prompt_tail: prompt length in tokens, and its last context-width token IDs
            (what detection needs in front of the text).
        token_ids, text, n_tokens, stop_reason: the generated text.
        blocks, drafted, masked_positions, diverse_positions: per-block accepted tokens, drafted
            tokens, and the unkeyed positions (repeated windows, diversity prefix).
        target_forwards, draft_forwards, aatps, tokens_per_s, timings: cost figures.
        scored_positions, pivots, pivots_k2, r_k2, n_scored: the positions the detector scores,
            the watermark key's pivots there, and mse-pseudo's second-key pivots and rejection
            variates.
        log_p / log_p_pseudo: ln p under every score, for the key's pivots and for mse-pseudo's
            mixed ones.
        lppl / lppl_dropped: mean -ln P(y_t | prefix) under the target, and tokens left out of it.
        rouge_l: ROUGE-L against the prompt's reference (None without one).
        extra: fields of a newer row shape that this version does not know, written back unchanged.
    """

    row_id: str
    prompt_id: str
    prompt_key: str
    method: str
    lookahead: int | None
    drafts: int
    drafter: str | None
    draft_temperature: float | None
    seed: int
    request_seed: int
    keyed: bool
    prompt_len: int
    prompt_tail: list[int]
    token_ids: list[int]
    text: str
    n_tokens: int
    stop_reason: str
    blocks: list[int]
    drafted: list[int]
    masked_positions: list[int]
    diverse_positions: list[int]
    target_forwards: int
    draft_forwards: int
    aatps: float
    tokens_per_s: float
    timings: dict[str, float]
    scored_positions: list[int]
    pivots: list[float]
    pivots_k2: list[float]
    r_k2: list[float]
    n_scored: int
    log_p: dict[ScoreName, float]
    log_p_pseudo: dict[ScoreName, float]
    lppl: float
    lppl_dropped: int
    rouge_l: float | None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The results.jsonl object: every field in declaration order, then the unknown ones."""
        out = {f.name: getattr(self, f.name) for f in _fields(type(self))}
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EvalRow:
        """A row from its results.jsonl object; fields this version does not know go to `extra`.

        Raises:
            InputError: the object lacks a field that has no default.
        """
        fields = _fields(cls)
        missing = [f.name for f in fields if f.name not in data and _required(f)]
        if missing:
            raise InputError(f"not a wmark eval row: no {', '.join(missing)}")
        names = {f.name for f in fields}
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


def _fields(cls: type[EvalRow]) -> list[dataclasses.Field[Any]]:
    """The row's JSON fields in declaration order (a subclass's new fields after the base's)."""
    return [f for f in dataclasses.fields(cls) if f.name != "extra"]


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
