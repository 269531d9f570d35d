"""The hybrid drafter: prompt lookup where the text repeats itself, a draft model elsewhere.

At each context of the draft tree the n-gram proposal (`wmark.generator.drafters.prompt_lookup`) is used
when the committed text has a long enough earlier match; only the other contexts go to the
model, and only then: a node is fed to the model (with any ancestors it has not seen yet) in the
one batched forward of the level that needs it. A block drafted wholly from the text costs no
drafter forward; the model catches up on the accepted tokens in its next forward, which it
runs anyway. Which drafter proposed where changes block lengths only, never the text.

On a CPU the model reads only the prompt's last `MODEL_CONTEXT` tokens (the lookup index reads
all of it): its prefill is paid before the first token, and on a long prompt reading the whole
cost more than the acceptance it bought; what the prompt says further back, lookup still
copies. (`build_drafter` gives a model on a GPU, where a prefill costs about one forward, the
whole prompt.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from wmark.generator.backend import LanguageModel, NodeTable, PrefillSession, Session
from wmark.generator.drafters.prompt_lookup import (
    DEEP_MATCH,
    MAX_MATCH,
    MIN_MATCH,
    SuffixIndex,
    lookup_trust,
    proposal_logits,
)

__all__ = ["MODEL_CONTEXT", "HybridDrafter", "HybridSession", "Rate", "ShortMatchRule"]


ROOT = -1
"""The block's root context (the committed text), in the per-context maps."""

PRIOR_RATE = 0.45
"""The acceptance both sources start from: the rate the target accepted lookup drafts after a
2-token match on the built-in prompts (`lookup_trust`)."""

PRIOR_WEIGHT = 8.0
"""... worth this many observed contexts, so a few blocks cannot flip the choice."""

MODEL_MARGIN = 0.2
"""How much more often the model's drafts must hold the target's token before it replaces a
short match: a model row costs a drafter forward (c, a fraction of a target forward: BENCHMARKS.md,
"Generation speed on CPU"), a lookup row nothing, and an accepted draft saves at most about one
target forward."""


MODEL_CONTEXT = 128
"""Prompt tokens the draft model reads (the last ones): its prefill, paid before the first
token and not sped up by drafting, follows this and not the prompt. Measured side by side on a
Zen 4 EPYC (BENCHMARKS.md, "Generation speed on CPU"): on ~850-token prompts the whole prompt
cost the 0.5B drafter ~1 s of prefill each and the default fell to 0.94x `basic-uwm`, with 128
tokens 1.02x (64: 1.04x); on the ~160-token built-in summaries 128 kept the whole prompt's
acceptance (1.34x against 1.35x) where 64 lost it (AATPS 2.39 -> 2.16, 1.26x)."""


@dataclass
class Rate:
    """A running hit rate that starts at `PRIOR_RATE`, worth `PRIOR_WEIGHT` observations."""

    hits: float = PRIOR_RATE * PRIOR_WEIGHT
    seen: float = PRIOR_WEIGHT

    def record(self, hit: bool) -> None:
        self.hits += hit
        self.seen += 1

    @property
    def value(self) -> float:
        return self.hits / self.seen


@dataclass
class ShortMatchRule:
    """Whether a short lookup match (fewer than `DEEP_MATCH` tokens) or the model proposes, per
    generation, from how often each one's drafts held the token the target chose.

    Short matches copy an article well and replace better model drafts on code: counted on the
    built-in prompts (BENCHMARKS.md, "Generation speed on CPU"), using them from 2 tokens on
    decoded summaries faster than from 4 on, and code slower, with the same winner on almost
    every prompt of each set. So each
    generation measures both: every reached context with a short match scores it, used or not
    (a match has one or two successors, which MPFR's B = 2 drafts take whole, so whether they
    held the target's token is known either way); every reached context the model proposed at
    scores the model's drafts. The model takes over only when its rate beats the short
    matches' by `MODEL_MARGIN` (without it, summaries lost a little: the model's drafts were
    held more often there too, but not by enough to pay its forwards; on code the gap was wide;
    the rates are in docs/benchmarks-history.md). Which one proposes changes block lengths only,
    never the text.
    """

    short: Rate = field(default_factory=Rate)
    model: Rate = field(default_factory=Rate)

    def short_pays(self) -> bool:
        return self.short.value >= self.model.value - MODEL_MARGIN


class HybridSession:
    """A session of `HybridDrafter`; see `wmark.generator.backend.Session`."""

    def __init__(self, drafter: HybridDrafter, prompt_ids: Sequence[int]) -> None:
        self.vocab_size = drafter.vocab_size
        self.index = SuffixIndex(prompt_ids, min_match=drafter.min_match, max_match=drafter.max_match)
        # the model's view: the prompt's last `context` tokens (all of it where context is None)
        tail = prompt_ids[-drafter.context :] if drafter.context else prompt_ids
        self.model: Session = drafter.model.session(tail)
        self.nodes = NodeTable()
        self.model_ids: list[int] = []  # per node: its id in the model's session, -1 until fed
        self.fed = 0  # nodes fed to the model since the last accept
        self._root: torch.Tensor | None = None
        self._root_trust = 1.0  # a model's root row; a lookup root's `lookup_trust`
        self._trust: list[float] = []
        self.forwards = 0  # the model's forward passes (lookups cost none)
        # Where short matches pay, measured in this generation (see `ShortMatchRule`): per
        # context of the current block (ROOT or a node), the successors of its short match,
        # and which contexts' rows came from the model.
        self.rule = ShortMatchRule()
        self._short: dict[int, frozenset[int]] = {}
        self._from_model: set[int] = set()

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
            found = self._lookup(n, self._tail(n))
            if found is None:
                needy.append(n)
                self._from_model.add(n)
            else:
                rows[n], trust[n] = found
        if self._root is None:
            found = self._lookup(ROOT, [])
            if found is None:
                self._from_model.add(ROOT)  # the model's forward below gives the root
            else:
                self._root, self._root_trust = found
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
        node_rows = _stack([rows[n] for n in new], self.vocab_size)
        self._trust = [self._root_trust, *(trust[n] for n in new)]
        return self._root, node_rows

    def _lookup(self, context: int, tail: Sequence[int]) -> tuple[torch.Tensor, float] | None:
        """The lookup row and its trust at `context` (ROOT or a node, `tail` its path), or None
        where the model should propose: no match, or a short one while `rule` says the model's
        drafts are accepted more often in this generation."""
        found = self.index.match(tail)
        if found is None:
            return None
        counts, length = found
        if length < DEEP_MATCH:
            self._short[context] = frozenset(counts)
            if not self.rule.short_pays():
                return None
        return proposal_logits(counts, self.vocab_size), lookup_trust(length, len(counts))

    def _score(self, path: Sequence[int], following: Sequence[int]) -> None:
        """Feed `rule` this block's outcome: at each context the target reached (the root, then
        each node of the accepted path), whether a short match's successors held the token the
        target chose there (every context that had one, used or not), and whether a model
        row's drafts (the context's children) did."""
        children: dict[int, set[int]] = {}
        for node, parent in enumerate(self.nodes.parents):
            children.setdefault(ROOT if parent < 0 else parent, set()).add(self.nodes.tokens[node])
        for context, token in zip([ROOT, *path], following, strict=False):
            if context in self._short:
                self.rule.short.record(token in self._short[context])
            if context in self._from_model and context in children:
                self.rule.model.record(token in children[context])
        self._short.clear()
        self._from_model.clear()

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """See `Session.accept`. The fed nodes of a path are a prefix of it (ancestors go first)."""
        self.nodes.check_path(path)
        tokens = [self.nodes.tokens[n] for n in path]
        self._score(path, [*tokens, *extra])
        fed = [self.model_ids[n] for n in path if self.model_ids[n] >= 0]
        self.model.accept(fed, [*tokens[len(fed) :], *extra])
        self.index.append([*tokens, *extra])
        self.nodes.clear()
        self.model_ids.clear()
        self.fed = 0
        self._root = None


def _stack(rows: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """The rows as one (n, V) tensor, on the model's device where any row came from a model on
    a GPU (lookup rows are built on the CPU; a block may mix both)."""
    if not rows:
        return torch.empty(0, vocab_size)
    device = next((row.device for row in rows if row.device.type != "cpu"), rows[0].device)
    return torch.stack([row.to(device) for row in rows])


class HybridDrafter:
    """Prompt lookup backed by a draft model (which must share the target's vocabulary).

    `context`: prompt tokens the model reads (its last ones; None: the whole prompt).
    """

    def __init__(
        self,
        model: LanguageModel,
        *,
        min_match: int = MIN_MATCH,
        max_match: int = MAX_MATCH,
        context: int | None = MODEL_CONTEXT,
    ) -> None:
        if context is not None and context < 1:
            raise ValueError(f"context must be at least 1 token, got {context}")
        self.model = model
        self.context = context
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.tokenizer_sha256 = model.tokenizer_sha256
        self.min_match, self.max_match = min_match, max_match

    def session(self, prompt_ids: Sequence[int]) -> HybridSession:
        """See `LanguageModel.session`."""
        return HybridSession(self, prompt_ids)
