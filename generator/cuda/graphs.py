"""CUDA graphs of a model's forwards, one per input shape: captured on first use, replayed after.

A decode step of a 1.5B model is ~30 small kernels per layer; launched one by one from Python
they cost more than the GPU takes to run them (the step measured 24-77 ms on an H200 against
4.2 ms for the same forward replayed as a graph). A graph records the launches once and replays
them in one call, on the memory they were recorded with, so the forward it records must read
and write only fixed buffers: `wmark.generator.models.static_forward` provides them and calls
`CudaGraphs.run` with a closure over them. Everything here is the thin part that needs a GPU;
the forward it records is the one the CPU tests run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch

__all__ = ["CudaGraphs"]

_log = logging.getLogger(__name__)


class CudaGraphs:
    """Graphs keyed by shape; all share one memory pool (only one runs at a time)."""

    def __init__(self) -> None:
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = None
        self._eager: set[Hashable] = set()  # shapes whose capture failed

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`forward()`'s output, through the graph captured for `key` (captured now if new).

        The first call of a key runs `forward` once eagerly on a side stream (CUDA requires
        the kernels' lazy setup before a capture; it computes the same forward on the same
        inputs, so the rows it writes are the ones the replay writes again), records it, then
        replays the recording. The returned tensor is the graph's own output buffer: the next
        replay of that key overwrites it, so a caller keeps a copy. A shape whose capture
        fails (a kernel that synchronises, say) is logged and runs eagerly from then on: the
        same numbers, slower.
        """
        if key in self._eager:
            return forward()
        entry = self._graphs.get(key)
        if entry is None:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool):
                    output = forward()
            except RuntimeError as exc:  # a kernel that cannot be recorded: this shape runs eagerly
                _log.warning("CUDA graph capture failed for shape %s (%s); running it eagerly", key, exc)
                self._eager.add(key)
                return forward()
            self._pool = graph.pool()
            entry = self._graphs[key] = (graph, output)
        graph, output = entry
        graph.replay()
        return output

    def clear(self) -> None:
        """Forget every graph (the buffers they were recorded on are being replaced)."""
        self._graphs.clear()
        self._pool = None
        self._eager.clear()
