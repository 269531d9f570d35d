"""`EvalSession` without the CLI, on tiny model directories built here: progress callbacks in
order, and the interrupt story (a KeyboardInterrupt mid-run keeps every finished row, releases the
folder, and a rerun generates only the rest)."""

from __future__ import annotations

import json

import pytest

from wmark.eval.rows import EvalRow
from wmark.eval.runner import Job
from wmark.eval.session import EvalConfig, EvalInterrupted, EvalSession


class Recorder:
    """An `EvalProgress` that logs every call and interrupts after `stop_after` rows."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.events: list[tuple[str, object]] = []
        self.stop_after = stop_after

    def loading(self, message: str) -> None:
        self.events.append(("loading", message))

    def started(self, jobs: int, max_new_tokens: int) -> None:
        self.events.append(("started", (jobs, max_new_tokens)))

    def job_started(self, job: Job) -> None:
        self.events.append(("job", job.row_id))

    def tokens(self, generated: int) -> None:
        self.events.append(("tokens", generated))

    def job_done(self, row: EvalRow) -> None:
        self.events.append(("done", row.row_id))
        if self.stop_after is not None and sum(e[0] == "done" for e in self.events) == self.stop_after:
            raise KeyboardInterrupt  # what Ctrl-C raises in the running thread


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, word_model_dir) -> EvalConfig:
    root = tmp_path_factory.mktemp("session")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(2))
    )
    return EvalConfig(
        out=root / "out",
        prompts=str(prompts),
        methods=["pfr", "mse"],
        lookaheads=[2],
        drafters=[str(word_model_dir(root / "drafter", 1))],
        target=str(word_model_dir(root / "target", 0)),
        max_new_tokens=8,
        chat=False,
        precision="exact-fp32",
    )


def test_an_interrupted_session_keeps_its_rows_and_resumes(config: EvalConfig):
    session = EvalSession(config)
    planned = [j.row_id for j in session.plan]
    assert len(planned) == 4  # 2 prompts x (pfr, mse) at L=2
    first = Recorder(stop_after=2)
    with pytest.raises(EvalInterrupted) as info:
        session.run(first)
    assert info.value.new_rows == 2 and info.value.results == config.out / "results.jsonl"
    assert [r.row_id for r in session.rows()] == planned[:2]
    kinds = [e[0] for e in first.events]
    assert kinds[0] == "loading" and kinds.index("started") < kinds.index("job")
    assert ("started", (4, 8)) in first.events
    done = [e[1] for e in first.events if e[0] == "done"]
    assert done == planned[:2]
    tokens = [e[1] for e in first.events if e[0] == "tokens"]
    assert tokens and all(isinstance(n, int) and 0 < n <= 8 for n in tokens)

    # The folder is free again (the writer lock is released), and a rerun runs only the rest.
    second = Recorder()
    rows = EvalSession(config).run(second)
    assert [r.row_id for r in rows] == planned
    assert [e[1] for e in second.events if e[0] == "done"] == planned[2:]
    assert ("started", (2, 8)) in second.events
    written = EvalSession(config).write_outputs(rows, plots=False)
    assert [p.name for p in written] == ["summary.md"] and "## Single draft" in written[0].read_text()
