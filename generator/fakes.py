"""`FakeLM`: a language model with scripted distributions, implementing the backend protocol.

For exactness tests (known P and Q) and fast sampler tests. Logits are a pure function of the
context, so drafter invariance and acceptance bounds can be checked against closed forms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from wmark.generator.backend import NodeTable

__all__ = ["FakeLM", "FakeSession"]

LogitsFn = Callable[[tuple[int, ...]], npt.NDArray[np.float64]]


class FakeSession:
    """A session over `FakeLM`: no cache to manage, but the same node/accept semantics."""

    def __init__(self, model: FakeLM, prompt_ids: Sequence[int]) -> None:
        self.model = model
        self.committed: list[int] = []
        self.pending: list[int] = [int(t) for t in prompt_ids]
        self.nodes = NodeTable()
        self.forwards = 0

    def _logits(self, context: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(self.model.logits_fn(tuple(context)), dtype=torch.float32)

    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """See `Session.extend`."""
        new = self.nodes.add(parents, tokens)
        if self.pending or new:
            self.forwards += 1
        self.committed += self.pending
        self.pending = []
        root = self._logits(self.committed)
        rows = [
            self._logits(self.committed + [self.nodes.tokens[a] for a in self.nodes.ancestors(n)])
            for n in new
        ]
        return root, torch.stack(rows) if rows else torch.empty(0, self.model.vocab_size)

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """See `Session.accept`."""
        self.nodes.check_path(path)
        self.committed += [self.nodes.tokens[n] for n in path]
        self.pending = [int(t) for t in extra]
        self.nodes.clear()


class FakeLM:
    """Scripted logits: `logits_fn(context) -> (V,)` for every context (prompt + generated).

    Args:
        vocab_size: V.
        logits_fn: logits of the next token given the full context.
        eos_token_ids: tokens that end generation.
    """

    def __init__(
        self, vocab_size: int, logits_fn: LogitsFn, eos_token_ids: frozenset[int] = frozenset()
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer_sha256: str | None = None
        self.logits_fn = logits_fn
        self.eos_token_ids = eos_token_ids

    @classmethod
    def fixed(cls, probs: npt.ArrayLike, eos_token_ids: frozenset[int] = frozenset()) -> FakeLM:
        """The same next-token distribution at every context."""
        logits = _log(np.asarray(probs, dtype=np.float64))
        return cls(len(logits), lambda _ctx: logits, eos_token_ids)

    @classmethod
    def markov(cls, table: npt.ArrayLike) -> FakeLM:
        """Next-token distribution table[last token] (row-stochastic (V, V) table)."""
        logits = _log(np.asarray(table, dtype=np.float64))
        return cls(logits.shape[1], lambda ctx: logits[ctx[-1]])

    def session(self, prompt_ids: Sequence[int]) -> FakeSession:
        """See `LanguageModel.session`."""
        return FakeSession(self, prompt_ids)


def _log(probs: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = np.where(probs > 0, np.log(probs), -np.inf)
    return out
