"""`CudaGraphs`' bookkeeping, with torch.cuda's stream and graph calls replaced by recorders (this
suite has no GPU; `bench/gpu_check.py` runs the real thing): one eager warm-up and one capture
per key, replays after, a failed capture falling back to eager for that key only, `clear`."""

from __future__ import annotations

import contextlib

import pytest
import torch

from wmark.generator.cuda import graphs as graphs_module
from wmark.generator.cuda.graphs import CudaGraphs


class _Recorder:
    """Stand-ins for torch.cuda.Stream / stream / current_stream / CUDAGraph / graph."""

    def __init__(self, fail_keys: set[str]) -> None:
        self.events: list[str] = []
        self.fail_keys = fail_keys
        self.capturing: str | None = None
        recorder = self

        class Stream:
            def wait_stream(self, _other: object) -> None:
                pass

        class Graph:
            def __init__(self) -> None:
                self.key = recorder.capturing

            def replay(self) -> None:
                recorder.events.append("replay")

            def pool(self) -> str:
                return "pool"

        @contextlib.contextmanager
        def graph(g: Graph, pool: object = None) -> object:  # noqa: ARG001 - torch's signature
            recorder.events.append("capture")
            yield
            if recorder.capturing in recorder.fail_keys:
                raise RuntimeError("operation not permitted when stream is capturing")

        self.Stream, self.CUDAGraph, self.graph = Stream, Graph, graph
        self.stream = lambda _s: contextlib.nullcontext()
        self.current_stream = Stream


@pytest.fixture()
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    fake = _Recorder({"bad"})
    for name in ("Stream", "CUDAGraph", "graph", "stream", "current_stream"):
        monkeypatch.setattr(graphs_module.torch.cuda, name, getattr(fake, name))
    return fake


def _forward(recorder: _Recorder, key: str):
    def run() -> torch.Tensor:
        recorder.capturing = key
        recorder.events.append("forward")
        return torch.ones(1)

    return run


def test_a_key_is_warmed_captured_once_then_replayed(recorder):
    graphs = CudaGraphs()
    for _ in range(3):
        out = graphs.run("b4", _forward(recorder, "b4"))
    # warm-up, the capture (which records the forward), then a replay per call
    assert recorder.events == ["forward", "capture", "forward", "replay", "replay", "replay"]
    assert len(graphs) == 1 and torch.equal(out, torch.ones(1))


def test_a_failed_capture_runs_that_key_eagerly_from_then_on(recorder, caplog):
    graphs = CudaGraphs()
    with caplog.at_level("WARNING"):
        graphs.run("bad", _forward(recorder, "bad"))
    assert "capture failed" in caplog.text
    recorder.events.clear()
    graphs.run("bad", _forward(recorder, "bad"))
    assert recorder.events == ["forward"]  # eager, no second capture
    graphs.run("good", _forward(recorder, "good"))
    assert recorder.events == ["forward", "forward", "capture", "forward", "replay"]
    assert len(graphs) == 1


def test_clear_forgets_graphs_and_failures(recorder):
    graphs = CudaGraphs()
    graphs.run("b1", _forward(recorder, "b1"))
    graphs.run("bad", _forward(recorder, "bad"))
    graphs.clear()
    recorder.events.clear()
    graphs.run("b1", _forward(recorder, "b1"))
    assert recorder.events == ["forward", "capture", "forward", "replay"]  # captured again
