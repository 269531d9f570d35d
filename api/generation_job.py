"""What passes between a generation request and the worker that serves it.

The route builds a `Job` (the prompt, the sampler `served_sampler` makes of the request, the
key, who asked) and reads its `events`: the tokens of each block (`Tokens`), then `Finished`
(after the audit row is written) or `Failed`. The worker (`wmark.api.generation`) sends them
from its thread; a client that goes away cancels its job.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wmark.api.generate_settings import GenerationSettings
from wmark.errors import WmarkError
from wmark.generator.engine import SamplerConfig
from wmark.generator.logits import LogitsConfig
from wmark.generator.result import GenerationResult
from wmark.keymaterial import KeyMaterial

__all__ = ["Event", "Failed", "Finished", "Job", "Tokens", "served_sampler"]


def served_sampler(
    settings: GenerationSettings, *, max_tokens: int, temperature: float, top_p: float
) -> SamplerConfig:
    """The sampler a request runs: the server's method with the default drafting (the same as
    `wmark generate`'s: L = 6, a branch ending below the drafter's probability 0.8) and the
    request's budget, temperature and top-p."""
    assert settings.method is not None
    logits = LogitsConfig(temperature=temperature, top_k=settings.top_k, top_p=top_p)
    return SamplerConfig(
        method=settings.method,
        max_new_tokens=max_tokens,
        target_logits=logits,
        draft_logits=logits,
    )


@dataclass(frozen=True)
class Tokens:
    """The tokens one block emitted."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    """The generation ended (EOS, budget, or cancelled) and was audited as `audit_seq`."""

    result: GenerationResult
    audit_seq: int


@dataclass(frozen=True)
class Failed:
    """The generation did not finish: `error` says why (a `WmarkError`, or the database's
    `OperationalError`: both have their handler, so the client gets OpenAI's error shape)."""

    error: Exception


Event = Tokens | Finished | Failed


@dataclass(eq=False, kw_only=True)
class Job:
    """One request's generation.

    Attributes:
        prompt_ids: the prompt's token IDs.
        config: sampler settings (method, budget, temperature, top-p ...).
        key: the server's watermark key.
        seed: the request's seed (reproducible unkeyed randomness), or None.
        token_id: the token that asked (checked for revocation until the job ends).
        audit: what the audit row says about the request besides the generation (endpoint,
            prompt digest).
        stream: its tokens go to the client block by block (audited at its start too).
        stopped: set by the worker when a revocation stopped the job.
        start_seq: the audit row of a streamed job's start, once written.
    """

    prompt_ids: Sequence[int]
    config: SamplerConfig
    key: KeyMaterial
    seed: int | None
    token_id: str
    audit: dict[str, Any]
    stream: bool = False
    stopped: WmarkError | None = None
    start_seq: int | None = None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    on_cancel: Callable[[Job], None] | None = None  # set by `Generation.submit`: frees its place

    @property
    def actor(self) -> str:
        """Who asked, as the audit log names them."""
        return f"token:{self.token_id}"

    def cancel(self) -> None:
        """Stop generating at the next block boundary (no-op once finished); a job still waiting
        gives its place in the queue back at once."""
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel(self)

    def send(self, event: Event) -> None:
        """From the worker thread: hand `event` to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel()

    async def finished(self) -> Finished:
        """Wait for the end (tokens are skipped); re-raise the worker's error."""
        while True:
            event = await self.events.get()
            if isinstance(event, Finished):
                return event
            if isinstance(event, Failed):
                raise event.error
