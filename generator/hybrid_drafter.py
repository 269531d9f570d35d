"""The hybrid drafter: prompt lookup where the text repeats itself, a draft model elsewhere.

At each context of the draft tree the n-gram proposal (`wmark.generator.prompt_lookup`) is used
when the committed text has a long enough earlier match; only the other contexts go to the
model, and only then: a node is fed to the model (with any ancestors it has not seen yet) in the
one batched forward of the level that needs it. A block drafted wholly from the text costs no
drafter forward; the model catches up on the accepted tokens in its next forward, which it
runs anyway. Which drafter proposed where changes block lengths only, never the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from wmark.generator.backend import LanguageModel, NodeTable, PrefillSession, Session
from wmark.generator.prompt_lookup import DEEP_MATCH, MAX_MATCH, MIN_MATCH, SuffixIndex

__all__ = ["HybridDrafter", "HybridSession"]


class HybridSession:
    """A session of `HybridDrafter`; see `wmark.generator.backend.Session`."""

    def __init__(self, drafter: HybridDrafter, prompt_ids: Sequence[int]) -> None:
        self.vocab_size = drafter.vocab_size
        self.index = SuffixIndex(prompt_ids, min_match=drafter.min_match, max_match=drafter.max_match)
        self.model: Session = drafter.model.session(prompt_ids)
        self.nodes = NodeTable()
        self.model_ids: list[int] = []  # per node: its id in the model's session, -1 until fed
        self.fed = 0  # nodes fed to the model since the last accept
        self._root: torch.Tensor | None = None
        self._root_trust = 1.0  # a model's root row; a lookup root's `lookup_trust`
        self._trust: list[float] = []
        self.forwards = 0  # the model's forward passes (lookups cost none)

    def prefill(self) -> None:
        """See `backend.PrefillSession`: the model's prompt (the lookup index is built already)."""
        if isinstance(self.model, PrefillSession):
            self.model.prefill()

    def row_trust(self) -> list[float]:
        """See `backend.TrustedSession`: lookup rows their `lookup_trust`, model rows 1.0."""
        return self._trust

    def _tail(self, node: int) -> list[int]:
        return [self.nodes.tokens[a] for a in self.nodes.ancestors(node)]

    def extend_lookup(
        self, parents: Sequence[int], tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See `backend.LookupSession`: lookup rows only (matches of at least `DEEP_MATCH` tokens);
        the model is not asked (nor fed these nodes)."""
        if self._root is None:
            raise RuntimeError("extend_lookup continues a block: call extend first")
        new = self.nodes.add(parents, tokens)
        self.model_ids.extend([-1] * len(new))
        rows = [self.index.row(self._tail(n), self.vocab_size, DEEP_MATCH) for n in new]
        self._trust = [self._root_trust, *(trust for _, trust in rows)]
        return self._root, torch.stack([row for row, _ in rows]) if rows else torch.empty(0, self.vocab_size)

    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """See `Session.extend`: lookup rows where the text matches, model rows (one forward) elsewhere."""
        new = self.nodes.add(parents, tokens)
        self.model_ids.extend([-1] * len(new))
        rows: dict[int, torch.Tensor] = {}
        trust = dict.fromkeys(new, 1.0)
        needy = []
        for n in new:
            found = self.index.proposal(self._tail(n), self.vocab_size)
            if found is None:
                needy.append(n)
            else:
                rows[n], trust[n] = found
        if self._root is None:
            row, self._root_trust = self.index.row([], self.vocab_size)
            self._root = row if self._root_trust > 0.0 else None
        if needy or self._root is None:
            feed = sorted({a for n in needy for a in self.nodes.ancestors(n) if self.model_ids[a] < 0})
            for k, n in enumerate(feed):
                self.model_ids[n] = self.fed + k
            self.fed += len(feed)
            model_root, model_rows = self.model.extend(
                [self.model_ids[p] if (p := self.nodes.parents[n]) >= 0 else -1 for n in feed],
                [self.nodes.tokens[n] for n in feed],
            )
            self.forwards = int(getattr(self.model, "forwards", self.forwards + 1))
            if self._root is None:
                self._root, self._root_trust = model_root, 1.0
            for n in needy:
                rows[n] = model_rows[feed.index(n)]
        node_rows = torch.stack([rows[n] for n in new]) if new else torch.empty(0, self.vocab_size)
        self._trust = [self._root_trust, *(trust[n] for n in new)]
        return self._root, node_rows

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """See `Session.accept`. The fed nodes of a path are a prefix of it (ancestors go first)."""
        self.nodes.check_path(path)
        tokens = [self.nodes.tokens[n] for n in path]
        fed = [self.model_ids[n] for n in path if self.model_ids[n] >= 0]
        self.model.accept(fed, [*tokens[len(fed) :], *extra])
        self.index.append([*tokens, *extra])
        self.nodes.clear()
        self.model_ids.clear()
        self.fed = 0
        self._root = None


class HybridDrafter:
    """Prompt lookup backed by a draft model (which must share the target's vocabulary)."""

    def __init__(
        self, model: LanguageModel, *, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH
    ) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.tokenizer_sha256 = model.tokenizer_sha256
        self.min_match, self.max_match = min_match, max_match

    def session(self, prompt_ids: Sequence[int]) -> HybridSession:
        """See `LanguageModel.session`."""
        return HybridSession(self, prompt_ids)
