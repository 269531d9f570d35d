"""`wmark generate` end to end on tiny model directories built here: JSON fields, detection of the
output by `wmark detect`, and one-line errors (exit 2) for every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wmark.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, word_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "target": word_model_dir(root / "target", 0),
        "drafter": word_model_dir(root / "drafter", 1),
        "other": word_model_dir(root / "other", 2, prefix="x"),  # a different vocabulary
    }


def _key(dirs: dict[str, Path], *extra: str) -> str:
    result = runner.invoke(app, ["keys", "create", "tiny", "--tokenizer", str(dirs["target"]), *extra])
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def _generate(dirs: dict[str, Path], *extra: str, drafter: str = "drafter"):
    args = [
        "generate",
        "--target",
        str(dirs["target"]),
        "--drafter",
        str(dirs[drafter]) if drafter in dirs else drafter,
        "--precision",
        "exact-fp32",
        "--json",
        *extra,
    ]
    return runner.invoke(app, args)


def test_generate_json_and_detect_round_trip(dirs, tmp_path):
    key_id = _key(dirs)
    prompt = " ".join(f"w{i}" for i in range(10, 30))
    result = _generate(dirs, "--raw", "--max-new-tokens", "120", "--seed", "3", prompt)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for field in ("text", "token_ids", "method", "key_id", "blocks", "aatps", "tokens_per_s"):
        assert field in out
    assert out["method"] == "mpfr" and out["key_id"] == key_id and sum(out["blocks"]) == len(out["token_ids"])
    assert out["aatps"] == pytest.approx(len(out["token_ids"]) / len(out["blocks"]))
    text = tmp_path / "answer.txt"
    text.write_text(out["text"])
    detection = json.loads(runner.invoke(app, ["detect", str(text), "--json"]).stdout)
    assert detection["verdict"] == "watermarked" and detection["key_id"] == key_id

    same = json.loads(
        _generate(
            dirs, "--raw", "--max-new-tokens", "120", "--seed", "3", "--method", "basic-uwm", prompt
        ).stdout
    )
    assert same["token_ids"] == out["token_ids"]  # drafter invariance through the CLI
    nowm = json.loads(
        _generate(
            dirs, "--raw", "--max-new-tokens", "120", "--method", "pfr-nowm", "--drafts", "1", prompt
        ).stdout
    )
    assert nowm["key_id"] is None


@pytest.mark.parametrize(
    "drafter,lookup",
    [("ngram", "0"), ("auto", "0"), ("ngram", "10")],  # auto: prompt lookup alone for a non-embedded target
)
def test_model_free_drafters_emit_basic_uwm_text(dirs, drafter, lookup):
    key_id = _key(dirs)
    prompt = " ".join(f"w{i % 7}" for i in range(40))  # repetitive: lookup has matches to draft from
    common = ("--key", key_id, "--raw", "--max-new-tokens", "60", "--seed", "4")
    base = json.loads(_generate(dirs, *common, "--method", "basic-uwm", prompt).stdout)
    result = _generate(
        dirs,
        *common,
        "--drafts",
        "2",
        "--draft-confidence",
        "0.2",
        "--lookup-lookahead",
        lookup,
        prompt,
        drafter=drafter,
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["token_ids"] == base["token_ids"] and out["draft_forwards"] == 0


def test_a_prefix_mode_key_generates_and_its_records_detect(dirs, tmp_path):
    key_id = _key(dirs, "--context-mode", "prefix")  # the paper's labels: the whole prefix
    prompt = " ".join(f"w{i}" for i in range(40, 52))
    result = _generate(dirs, "--raw", "--max-new-tokens", "100", "--seed", "4", prompt)
    assert result.exit_code == 0, result.output
    record = tmp_path / "gen.json"
    record.write_text(result.stdout)
    out = json.loads(result.stdout)
    detection = json.loads(runner.invoke(app, ["detect", "--generation", str(record), "--json"]).stdout)
    assert detection["verdict"] == "watermarked" and detection["key_id"] == key_id
    assert detection["n_scored"] == len(out["token_ids"])  # every generated position
    basic = json.loads(
        _generate(
            dirs, "--raw", "--max-new-tokens", "100", "--seed", "4", "--method", "basic-uwm", prompt
        ).stdout
    )
    assert basic["token_ids"] == out["token_ids"]  # drafter invariance holds for prefix labels too
    bad = tmp_path / "bad.json"
    bad.write_text('{"prompt_ids": [1], "token_ids": ["w1"], "text": "w1"}')
    failed = runner.invoke(app, ["detect", "--generation", str(bad)])
    assert failed.exit_code == 2 and "token IDs" in failed.output


def test_prompt_file_and_chat_template_free_models(dirs, tmp_path):
    _key(dirs)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("w1 w2 w3 w4 w5 w6")
    result = _generate(dirs, "--raw", "--max-new-tokens", "8", "--prompt-file", str(prompt))
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["token_ids"]) <= 8


@pytest.mark.parametrize(
    "args,message",
    [
        (["--raw", ""], "prompt is empty"),
        (["--raw", "   "], "prompt is empty"),
        (["--raw", "--drafts", "0", "w1 w2"], "drafts must be in"),
        (["--raw", "--drafts", "65", "w1 w2"], "drafts must be in"),
        (["--raw", "--lookahead", "0", "w1 w2"], "lookahead must be in"),
        (["--raw", "--lookahead", "99", "w1 w2"], "lookahead must be in"),
        (["--raw", "--lookup-lookahead", "99", "w1 w2"], "lookup_lookahead must be in"),
        (["--raw", "--method", "pfr", "--drafts", "4", "w1 w2"], "single-draft"),
        (["--raw", "--method", "nope", "w1 w2"], "unknown method"),
        (["--raw", "--temperature", "0", "w1 w2"], "temperature"),
        (["--raw", "--key", "wk_unknown", "w1 w2"], "no key with id"),
        (["--raw", "--prompt-file", "/nonexistent/prompt.txt"], "no such file"),
        (["--raw", "--device", "tpu", "w1 w2"], "device"),
        (["--raw", "--stream", "w1 w2"], "--stream prints the text as it comes, --json one object"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(dirs, args, message):
    _key(dirs)
    result = _generate(dirs, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_drafter_with_another_tokenizer_is_refused(dirs):
    _key(dirs)
    result = _generate(dirs, "--raw", "w1 w2 w3", drafter="other")
    assert result.exit_code == 2 and "does not share the target's tokenizer" in result.stderr


def test_revoked_and_retired_keys_cannot_generate(dirs):
    key_id = _key(dirs)
    new_id = runner.invoke(app, ["keys", "rotate", key_id]).stdout.strip()
    result = _generate(dirs, "--raw", "--key", key_id, "w1 w2 w3")
    assert result.exit_code == 2 and "retired" in result.stderr
    runner.invoke(app, ["keys", "revoke", new_id])
    result = _generate(dirs, "--raw", "--key", new_id, "w1 w2 w3")
    assert result.exit_code == 2 and "revoked" in result.stderr
    result = _generate(dirs, "--raw", "w1 w2 w3")  # no active key left
    assert result.exit_code == 2 and "no active key" in result.stderr


def test_key_bound_to_another_tokenizer_is_refused(dirs):
    result = runner.invoke(app, ["keys", "create", "other", "--tokenizer", str(dirs["other"])])
    assert result.exit_code == 0
    result = _generate(dirs, "--raw", "w1 w2 w3")
    assert result.exit_code == 2 and "is bound to tokenizer" in result.stderr


def test_cli_defaults_are_the_measured_dynamic_lookahead(dirs, monkeypatch):
    """`wmark generate` drafts with the CPU-measured defaults (BENCHMARKS.md; `SamplerConfig`'s own
    since 2026-12-07), not the paper's fixed L = 4."""
    import wmark.generator.engine as engine

    seen: list[engine.SamplerConfig] = []
    real = engine.SamplerConfig

    def recording(**kwargs):
        seen.append(real(**kwargs))
        return seen[-1]

    monkeypatch.setattr(engine, "SamplerConfig", recording)
    _key(dirs)
    result = _generate(dirs, "--raw", "--max-new-tokens", "8", "--seed", "1", "w10 w11 w12")
    assert result.exit_code == 0, result.output
    assert (seen[0].draft_confidence, seen[0].lookahead) == (0.8, 6)


def test_stream_prints_the_text_as_it_comes_and_nothing_else(dirs, monkeypatch):
    from wmark.generator.text_stream import TextStream

    _key(dirs)
    args = ["--target", str(dirs["target"]), "--drafter", str(dirs["drafter"]), "--precision", "exact-fp32"]
    args += ["--raw", "--max-new-tokens", "40", "--seed", "2", "w10 w11 w12"]
    whole = runner.invoke(app, ["generate", "--no-stream", *args])
    assert whole.exit_code == 0, whole.output
    pieces: list[str] = []
    real = TextStream.delta

    def recording(self: TextStream, ids: list[int]) -> str:
        pieces.append(real(self, ids))
        return pieces[-1]

    monkeypatch.setattr(TextStream, "delta", recording)
    streamed = runner.invoke(app, ["generate", "--stream", *args])
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == whole.stdout  # the same text and final newline, nothing else on stdout
    assert sum(1 for piece in pieces if piece) > 1  # printed block by block, not at the end
    printed = len(pieces)
    assert runner.invoke(app, ["generate", *args]).stdout == whole.stdout
    assert len(pieces) == printed  # the default: stdout here is not a terminal, so no stream


def test_stream_shows_a_spinner_while_the_prompt_is_read_and_stops_it_before_the_text(dirs, monkeypatch):
    import wmark.cli.generate as generate_cli

    events: list[str] = []

    class Spinner:  # rich's Status, as the command uses it
        def __init__(self, message: str) -> None:
            events.append(message)

        def start(self) -> None:
            events.append("start")

        def stop(self) -> None:
            events.append("stop")

        def update(self, message: str) -> None:
            pass

        def __enter__(self) -> Spinner:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    _key(dirs)
    monkeypatch.setattr(generate_cli.err_console, "status", Spinner)
    monkeypatch.setattr(generate_cli, "_show", lambda piece: events.append("text") if piece else None)
    args = ["--target", str(dirs["target"]), "--drafter", str(dirs["drafter"]), "--precision", "exact-fp32"]
    result = runner.invoke(
        app, ["generate", "--stream", *args, "--raw", "--max-new-tokens", "12", "--seed", "2", "w10 w11 w12"]
    )
    assert result.exit_code == 0, result.output
    shown = events[events.index("reading the prompt (3 tokens)") :]
    assert shown[1] == "start" and "text" in shown
    assert "stop" in shown[: shown.index("text")]  # stopped before the first text: never drawn over it
