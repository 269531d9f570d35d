"""The keyed race for a batch of serving requests, one row of logits per request, without vLLM.

`wmark.integrations.vllm` drives this from vLLM's batch updates; it is separate so that the rule
is tested without vLLM. Each watermarked request keeps a `ClockPolicy` over its prompt and
generated tokens, the one wmark's generator uses, so each emitted token is what `basic-uwm`
emits for the same logits: the winner of the race argmin_v -ln U(v, 1) / P(v) on the request's
distribution after temperature, top-k and top-p, with the same repeated-window masking and
unkeyed diversity prefix. Uniforms are computed for the support only (wmark's fast PRF), never
for the whole vocabulary. A row is then forced to its winner (every other logit -inf), so the
serving stack's own sampler can only emit it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from wmark.generator.clocks import ClockKind, ClockPolicy
from wmark.generator.engine import request_nonce
from wmark.generator.logits import LogitsConfig, supports
from wmark.generator.speculative import race
from wmark.keymaterial import KeyMaterial

__all__ = ["RaceBatch", "RequestRace"]


@dataclass
class RequestRace:
    """One request's race state.

    Attributes:
        policy: the clocks (key, repeated-window mask, diversity prefix).
        prompt: the prompt's token IDs.
        outputs: the generated token IDs; the serving stack may append to this very list.
        logits: temperature, top-k, top-p of the request.
        committed: how many of `outputs` the policy has recorded.
        forced: (token, kind, probability) of the last winner this request was forced to.
    """

    policy: ClockPolicy
    prompt: list[int]
    outputs: list[int]
    logits: LogitsConfig
    committed: int = 0
    forced: tuple[int, ClockKind, float] | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        key: KeyMaterial,
        prompt: list[int],
        outputs: list[int],
        logits: LogitsConfig,
        *,
        seed: int | None,
        diversity_bits: float,
    ) -> RequestRace:
        """A new request (or one resumed with `outputs` already generated)."""
        policy = ClockPolicy(key, request_nonce(seed), prompt_len=len(prompt), diversity_bits=diversity_bits)
        return cls(policy, prompt, outputs, logits)

    def _sync(self) -> None:
        # Record the tokens emitted since the last step. The forced winner carries its kind and
        # probability; a token the race did not pick here (a request resumed with output already
        # generated) closes the diversity prefix, the conservative choice.
        while self.committed < len(self.outputs):
            prefix = self.prompt + self.outputs[: self.committed]
            token = self.outputs[self.committed]
            if (
                self.forced is not None
                and self.forced[0] == token
                and self.committed == len(self.outputs) - 1
            ):
                _, kind, prob = self.forced
            else:
                kind, prob = self.policy.kind(prefix), 0.5 ** (self.policy.diversity_bits + 1.0)
            self.policy.commit(prefix, kind, prob)
            self.committed += 1
        self.forced = None

    def choose(self, row: torch.Tensor) -> int:
        """The race winner for the next position, given the request's logits row (V,)."""
        self._sync()
        prefix = self.prompt + self.outputs
        emission = race(self.policy, prefix, None, supports(row[None], self.logits)[0])
        self.forced = (emission.token, emission.kind, emission.prob)
        return emission.token


class RaceBatch:
    """Requests by batch row; rows without a race (greedy, allowed opt-outs) are left alone."""

    def __init__(self) -> None:
        self.rows: dict[int, RequestRace] = {}

    def add(self, index: int, request: RequestRace | None) -> None:
        """Put a request at `index` (replacing whatever was there); None: not watermarked."""
        if request is None:
            self.rows.pop(index, None)
        else:
            self.rows[index] = request

    def remove(self, index: int) -> None:
        """The request at `index` left the batch."""
        self.rows.pop(index, None)

    def move(self, source: int, target: int, *, swap: bool) -> None:
        """Move the request at `source` to `target` (or swap the two)."""
        moving, other = self.rows.pop(source, None), self.rows.pop(target, None)
        if moving is not None:
            self.rows[target] = moving
        if swap and other is not None:
            self.rows[source] = other

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force each watermarked row of (B, V) `logits` to its race winner, in place."""
        if not self.rows:
            return logits
        indices = sorted(self.rows)
        winners = [self.rows[i].choose(logits[i]) for i in indices]
        rows = torch.tensor(indices, dtype=torch.long, device=logits.device)
        cols = torch.tensor(winners, dtype=torch.long, device=logits.device)
        logits[rows] = -math.inf
        logits[rows, cols] = 0.0
        return logits
