"""Prompt sets: JSONL parsing (errors name the line), the built-in sets, and the CNN/DailyMail and
ELI5 loaders on small local files in each supported format (built here; nothing is downloaded)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet
import pytest

from wmark.errors import InputError
from wmark.eval.prompts import (
    BUILTIN_SETS,
    CNN_ARTICLE_PREFIX,
    Prompt,
    cnn_dailymail_prompts,
    eli5_prompts,
    load_prompt_set,
    parse_prompts,
)

GOOD = [
    {"id": "a", "prompt": "Explain tides.", "reference": "The moon pulls the sea."},
    {"id": "b", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
]


def _jsonl(rows: list[object]) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_parse_prompts_reads_both_shapes():
    a, b = parse_prompts(_jsonl(GOOD), "set.jsonl")
    assert a.prompt == "Explain tides." and a.reference == "The moon pulls the sea." and a.messages is None
    assert b.messages == (("system", "Be brief."), ("user", "Hi")) and b.reference is None
    assert a.chat_messages() == [{"role": "user", "content": "Explain tides."}]
    assert a.sha256 != b.sha256


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", "line 3: not valid JSON"),
        (json.dumps({"prompt": "x"}), 'line 3: "id" must be'),
        (json.dumps({"id": "c"}), "line 3: give exactly one of"),
        (json.dumps({"id": "c", "prompt": "x", "messages": []}), "line 3: give exactly one of"),
        (json.dumps({"id": "c", "prompt": ""}), 'line 3: "prompt" must be'),
        (json.dumps({"id": "c", "prompt": "x", "extra": 1}), "line 3: unknown field(s) extra"),
        (
            json.dumps({"id": "c", "messages": [{"role": "bot", "content": "x"}]}),
            'line 3: each message needs a "role"',
        ),
        (
            json.dumps({"id": "c", "messages": [{"role": "system", "content": "x"}]}),
            "line 3: no user message",
        ),
        (json.dumps({"id": "a", "prompt": "again"}), "line 3: duplicate id 'a'"),
        (json.dumps(["a list"]), "line 3: expected a JSON object"),
        (json.dumps({"id": "c", "prompt": "x", "reference": 3}), 'line 3: "reference" must be'),
    ],
)
def test_a_malformed_line_names_its_number(bad, message):
    with pytest.raises(InputError, match=f"set.jsonl, {message}".replace("(", r"\(").replace(")", r"\)")):
        parse_prompts(_jsonl(GOOD) + bad + "\n", "set.jsonl")


def test_empty_set_is_an_error():
    with pytest.raises(InputError, match="no prompts"):
        parse_prompts("\n\n", "empty.jsonl")


def test_builtin_sets_load_with_unique_ids_and_references_for_summaries():
    everything = load_prompt_set("builtin")
    parts = {name: load_prompt_set(name) for name in BUILTIN_SETS if name != "builtin"}
    assert len(everything.prompts) == sum(len(p.prompts) for p in parts.values()) >= 30
    assert len({p.id for p in everything.prompts}) == len(everything.prompts)
    assert all(p.reference for p in parts["summaries-mini"].prompts)
    assert all(
        p.messages[0] == ("system", "You are a helpful assistant.") for p in parts["eli5-mini"].prompts
    )
    assert len(load_prompt_set("builtin", limit=2).prompts) == 6  # the limit applies to each part


def test_prompt_file_and_errors(tmp_path: Path):
    path = tmp_path / "mine.jsonl"
    path.write_text(_jsonl(GOOD))
    assert [p.id for p in load_prompt_set(str(path), limit=1).prompts] == ["a"]
    with pytest.raises(InputError, match="no such prompt file or set"):
        load_prompt_set(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="--limit"):
        load_prompt_set("builtin", limit=0)


def _articles(n: int = 12) -> list[dict[str, str]]:
    # every third article is too long (>= 3000 characters) and must be skipped
    return [
        {
            "id": f"art{i}",
            "article": (f"Article {i}. " * (400 if i % 3 == 0 else 20)),
            "highlights": f"Summary {i}.",
        }
        for i in range(n)
    ]


def _expected_order(records: list[dict[str, str]]) -> list[str]:
    order = np.random.default_rng(42).permutation(len(records))  # datasets' shuffle(seed=42)
    return [records[i]["id"] for i in order if len(records[i]["article"]) < 3000]


def _write_arrow_stream(path: Path, records: list[dict[str, str]]) -> None:
    table = pa.Table.from_pylist(records)
    with pa.OSFile(str(path), "wb") as sink, pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet", "save_to_disk", "dataset_dict"])
def test_cnn_dailymail_loader_in_each_format(tmp_path: Path, fmt: str):
    records = _articles()
    if fmt == "csv":
        import csv

        path = tmp_path / "test.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["id", "article", "highlights"])
            writer.writeheader()
            writer.writerows(records)
    elif fmt == "jsonl":
        path = tmp_path / "test.jsonl"
        path.write_text(_jsonl(records))
    elif fmt == "parquet":  # the Hub layout: 3.0.0/{train,validation,test}-*.parquet
        path = tmp_path / "cnn"
        (path / "3.0.0").mkdir(parents=True)
        pyarrow.parquet.write_table(
            pa.Table.from_pylist(records), path / "3.0.0" / "test-00000-of-00001.parquet"
        )
        pyarrow.parquet.write_table(
            pa.Table.from_pylist(records[:2]), path / "3.0.0" / "train-00000-of-00001.parquet"
        )
    else:  # datasets' save_to_disk: Arrow IPC streams listed in state.json (per split for a DatasetDict)
        path = tmp_path / "cnn"
        split_dir = path / "test" if fmt == "dataset_dict" else path
        split_dir.mkdir(parents=True)
        _write_arrow_stream(split_dir / "data-00000-of-00001.arrow", records)
        (split_dir / "state.json").write_text(
            json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
        )
        if fmt == "dataset_dict":
            (path / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    prompts = cnn_dailymail_prompts(path)
    assert [p.id for p in prompts] == _expected_order(records)
    first = prompts[0]
    article = next(r["article"] for r in records if r["id"] == first.id)
    assert first.messages == (
        ("system", "You are a helpful assistant."),
        ("user", "Summarize the following article in 3-5 sentences:\n\n" + article[:CNN_ARTICLE_PREFIX]),
    )
    assert first.reference == f"Summary {first.id[3:]}."
    assert [p.id for p in cnn_dailymail_prompts(path, limit=3)] == _expected_order(records)[:3]
    assert [p.id for p in load_prompt_set(f"cnn_dailymail:{path}", limit=2).prompts] == _expected_order(
        records
    )[:2]


def test_eli5_loader_and_missing_columns(tmp_path: Path):
    rows = [{"question": f"Why {i}?", "answer": "Because."} for i in range(7)]
    path = tmp_path / "eli5.jsonl"
    path.write_text(_jsonl(rows))
    prompts = eli5_prompts(path, limit=4)
    order = np.random.default_rng(42).permutation(7)[:4]
    assert [p.messages[1][1] for p in prompts] == [
        f"Please explain like I'm five:\n\nWhy {i}?" for i in order
    ]
    assert all(p.reference is None for p in prompts)
    with pytest.raises(InputError, match="expected columns article, highlights"):
        cnn_dailymail_prompts(path)
    with pytest.raises(InputError, match="no such file"):
        eli5_prompts(tmp_path / "nope")
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "dataset_dict.json").write_text(json.dumps({"splits": ["validation"]}))
    with pytest.raises(InputError, match="no split 'train'"):
        eli5_prompts(tmp_path / "split")


def test_hu_huang_template_is_plain_text_with_the_article_cut_to_1000_characters(tmp_path: Path):
    # One article of 2,600 characters (kept: < 3,000, and longer than either cut), one of 3,100
    # (dropped), one short; every character position is recognisable, so a wrong cut shows.
    records = [
        {"id": "long", "article": "".join(chr(65 + i % 26) for i in range(2600)), "highlights": "L."},
        {"id": "too-long", "article": "x" * 3100, "highlights": "T."},
        {"id": "short", "article": "A short one.", "highlights": "S."},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text(_jsonl(records))
    prompts = load_prompt_set(f"cnn_dailymail:{path}", template="hu-huang").prompts
    chat = cnn_dailymail_prompts(path)
    assert [p.id for p in prompts] == [p.id for p in chat] == _expected_order(records)
    by_id = {p.id: p for p in prompts}
    long = by_id["long"]
    assert long.prompt == (
        "System:Summarize the following article.\nINPUT:" + records[0]["article"][:1000] + "\nOUTPUT:"
    )
    assert long.raw and long.messages is None and long.reference == "L."
    assert by_id["short"].prompt == "System:Summarize the following article.\nINPUT:A short one.\nOUTPUT:"
    # the chat template's prompts are unchanged, and a raw prompt is a different prompt (no row reuse)
    assert not any(p.raw for p in chat)
    assert long.sha256 != replace(long, raw=False).sha256


def test_prompt_template_errors(tmp_path: Path):
    with pytest.raises(InputError, match="unknown prompt template 'hu'"):
        load_prompt_set("builtin", template="hu")
    with pytest.raises(InputError, match="applies to cnn_dailymail:PATH prompts only"):
        load_prompt_set("eli5-mini", template="hu-huang")


def test_a_raw_prompt_never_goes_through_the_chat_template():
    from wmark.eval.models import prompt_encoder

    class Pair:  # records how each prompt is encoded
        class chat:  # noqa: N801 (the attribute name ModelPair has)
            chat_template = "x"

            @staticmethod
            def apply_chat_template(*_: object, **__: object) -> str:
                return "CHAT"

        def encode_prompt(self, text: str, *, chat: bool) -> list[int]:
            calls.append((text, chat))
            return [1]

    calls: list[tuple[str, bool]] = []
    raw = Prompt("r", prompt="System:S\nINPUT:a\nOUTPUT:", raw=True)
    for chat in (True, False):
        prompt_encoder(Pair(), chat=chat)(raw)  # type: ignore[arg-type]
    prompt_encoder(Pair(), chat=True)(Prompt("c", prompt="hello"))
    assert calls == [(raw.prompt, False), (raw.prompt, False), ("CHAT", False)]
