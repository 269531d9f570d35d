"""Prompt lookup: a drafter that costs no forward pass, drafting from what the text already says.

Summaries copy their article, code repeats its identifiers, and answers echo the question. The
drafter's distribution at a context is read off the committed text (prompt + generated so far):
find the longest suffix of the context (at least `min_match`, at most `max_match` tokens) that
occurred earlier, and count the tokens that followed its occurrences. That is a distribution
like any drafter's, so MPFR draws its B drafts from it on the same clocks (a context followed
by two different continuations offers both), and the text stays the target's race winners:
the drafter changes block lengths only. Where nothing matches, the drafter has no distribution
(an all -inf row): the sampler drafts nothing there (`PromptLookup` alone) or asks a model
(`wmark.generator.drafters.hybrid`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import torch

from wmark.generator.backend import NodeTable

__all__ = [
    "DEEP_MATCH",
    "MAX_MATCH",
    "MIN_MATCH",
    "PromptLookup",
    "PromptLookupSession",
    "SuffixIndex",
    "lookup_trust",
    "proposal_logits",
]

MIN_MATCH = 2  # a single shared token predicts its successor too poorly to spend a verify row on
MAX_MATCH = 8  # longer matches add nothing once a context is this specific
# Past L (lookup lookahead) a draft needs a longer match: each extra level is a verify row, and
# 2-3 token matches in prose are mostly rejected there (BENCHMARKS.md).
DEEP_MATCH = 4


def lookup_trust(length: int, successors: int) -> float:
    """How far to trust a lookup row's proposal (a `TrustedSession.row_trust` factor): the
    rate at which the target accepted lookup drafts on the embedded pair (eli5, summaries and
    code prompts, 128 tokens) was ~0.45 after a 2-token match and ~0.7 after a longer one, and
    lower again where the match was followed by several different continuations (x0.6)."""
    base = 0.45 if length <= 2 else 0.7
    return base * (0.6 if successors > 1 else 1.0)


class SuffixIndex:
    """The committed text with, for each token, where it occurs (positions that have a successor)."""

    def __init__(
        self, text: Sequence[int], *, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH
    ) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        self.min_match, self.max_match = min_match, max_match
        self.text: list[int] = []
        self._where: defaultdict[int, list[int]] = defaultdict(list)
        self.append(text)

    def append(self, tokens: Sequence[int]) -> None:
        """Commit more text (the last token gains a successor, so it becomes a match candidate)."""
        for token in tokens:
            if self.text:
                self._where[self.text[-1]].append(len(self.text) - 1)
            self.text.append(int(token))

    def continuations(self, tail: Sequence[int], min_match: int | None = None) -> Counter[int] | None:
        """Successor counts of the longest earlier match of (text + tail)'s suffix, or None.

        `tail`: tokens after the committed text (a draft path). Only the committed text is searched.
        `min_match`: a stricter minimum than the index's own for this query (None: the index's).
        """
        found = self.match(tail, min_match)
        return None if found is None else found[0]

    def match(self, tail: Sequence[int], min_match: int | None = None) -> tuple[Counter[int], int] | None:
        """`continuations` with the match's length: (successor counts, length), or None."""
        n_text = len(self.text)
        context_len = n_text + len(tail)
        if context_len == 0:
            return None

        def at(i: int) -> int:
            return self.text[i] if i < n_text else int(tail[i - n_text])

        best, found = 0, Counter[int]()
        for p in self._where.get(at(context_len - 1), ()):
            length = 1
            limit = min(self.max_match, p + 1, context_len)
            while length < limit and self.text[p - length] == at(context_len - 1 - length):
                length += 1
            if length > best:
                best, found = length, Counter()
            if length == best:
                found[self.text[p + 1]] += 1
        return (found, best) if best >= max(self.min_match, min_match or 0) else None

    def row(
        self, tail: Sequence[int], vocab_size: int, min_match: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """The proposal row after (text + tail) and its `lookup_trust` (0.0 with no match)."""
        return self.proposal(tail, vocab_size, min_match) or (proposal_logits(None, vocab_size), 0.0)

    def proposal(
        self, tail: Sequence[int], vocab_size: int, min_match: int | None = None
    ) -> tuple[torch.Tensor, float] | None:
        """`row`, or None with no match (no all -inf row built: a miss costs no 152k-wide fill)."""
        found = self.match(tail, min_match)
        if found is None:
            return None
        counts, length = found
        return proposal_logits(counts, vocab_size), lookup_trust(length, len(counts))


def proposal_logits(counts: Counter[int] | None, vocab_size: int) -> torch.Tensor:
    """A (V,) row: log counts on the observed successors, -inf elsewhere (all -inf: no proposal)."""
    row = torch.full((vocab_size,), -math.inf)
    if counts:
        row[list(counts)] = torch.tensor([math.log(c) for c in counts.values()])
    return row


class PromptLookupSession:
    """A session of `PromptLookup`; see `wmark.generator.backend.Session`. No forward passes."""

    forwards = 0

    def __init__(self, lookup: PromptLookup, prompt_ids: Sequence[int]) -> None:
        self.vocab_size = lookup.vocab_size
        self.index = SuffixIndex(prompt_ids, min_match=lookup.min_match, max_match=lookup.max_match)
        self.nodes = NodeTable()
        self._root: tuple[torch.Tensor, float] | None = None
        self._trust: list[float] = []

    def _rows(self, new: Sequence[int], min_match: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._root is not None
        tails = [[self.nodes.tokens[a] for a in self.nodes.ancestors(n)] for n in new]
        rows = [self.index.row(tail, self.vocab_size, min_match) for tail in tails]
        self._trust = [self._root[1], *(trust for _, trust in rows)]
        stacked = torch.stack([row for row, _ in rows]) if rows else torch.empty(0, self.vocab_size)
        return self._root[0], stacked

    def row_trust(self) -> list[float]:
        """See `backend.TrustedSession`."""
        return self._trust

    def extend(self, parents: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """See `Session.extend`."""
        new = self.nodes.add(parents, tokens)
        if self._root is None:
            self._root = self.index.row([], self.vocab_size)
        return self._rows(new)

    def extend_lookup(
        self, parents: Sequence[int], tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See `backend.LookupSession`: as `extend`, with matches of at least `DEEP_MATCH` tokens."""
        new = self.nodes.add(parents, tokens)
        assert self._root is not None, "extend_lookup continues a block: call extend first"
        return self._rows(new, DEEP_MATCH)

    def accept(self, path: Sequence[int], extra: Sequence[int]) -> None:
        """See `Session.accept`."""
        self.nodes.check_path(path)
        self.index.append([*(self.nodes.tokens[n] for n in path), *extra])
        self.nodes.clear()
        self._root = None


class PromptLookup:
    """The prompt-lookup drafter over a target's vocabulary (see the module docstring)."""

    def __init__(
        self,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        *,
        tokenizer_sha256: str | None = None,
        min_match: int = MIN_MATCH,
        max_match: int = MAX_MATCH,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.tokenizer_sha256 = tokenizer_sha256
        self.min_match, self.max_match = min_match, max_match
        self.name = "ngram"

    def session(self, prompt_ids: Sequence[int]) -> PromptLookupSession:
        """See `LanguageModel.session`."""
        return PromptLookupSession(self, prompt_ids)
