"""One loaded model pair and the queue in front of it: requests wait their turn, then generate.

A single worker thread owns the models (a model pair is neither thread-safe nor worth sharing:
one generation already keeps the cores busy). The event loop submits `Job`s and reads what the
worker sends back through the job's asyncio queue: the tokens of each block, then the result
(after the audit row is written) or the error. A job whose client went away is cancelled: the
engine checks between blocks and stops. At most `max_queue` jobs wait behind the running one;
one more is refused with `QueueFull` (429, Retry-After from the recent generation times).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wmark.api.errors import RateLimited
from wmark.api.generate_settings import GenerationSettings
from wmark.api.metrics import Metrics
from wmark.errors import WmarkError
from wmark.generator.backend import LanguageModel
from wmark.generator.cpu.threads import CoreMeter, ThreadPlan
from wmark.generator.drafters.build import build_drafter, drafter_model_source
from wmark.generator.engine import METHODS, SamplerConfig, check_key_binding, generate
from wmark.generator.logits import LogitsConfig
from wmark.generator.models.loading import ModelPair, load_pair
from wmark.generator.result import GenerationResult
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry
from wmark.keys.audit import AuditEntry, text_digest

__all__ = ["Failed", "Finished", "Generation", "Job", "QueueFull", "Tokens"]

log = logging.getLogger("wmark.api")


class QueueFull(RateLimited):
    """Every place in the generation queue is taken."""

    code = "queue_full"

    def __init__(self, retry_after: float, waiting: int) -> None:
        super().__init__(retry_after)
        self.args = (
            f"the generation queue is full ({waiting} waiting); retry in {math.ceil(retry_after)} s",
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
    """The generation raised."""

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
        actor: who asked (`token:<id>`), for the audit row.
        audit: what the audit row says about the request besides the generation (actor,
            endpoint, prompt digest).
    """

    prompt_ids: Sequence[int]
    config: SamplerConfig
    key: KeyMaterial
    seed: int | None
    actor: str
    audit: dict[str, Any]
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def cancel(self) -> None:
        """Stop generating at the next block boundary (no-op once finished)."""
        self.cancelled.set()

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


class Generation:
    """The served model pair, its worker thread and its queue.

    Build with `Generation.start` (loads the models; slow) and stop with `close`.
    """

    def __init__(
        self,
        settings: GenerationSettings,
        pair: ModelPair,
        registry: KeyRegistry,
        metrics: Metrics,
        drafter: LanguageModel | None = None,
    ) -> None:
        self.settings = settings
        self.pair = pair
        self.drafter = drafter  # what `settings.drafter` names (n-gram lookup needs no model)
        self.registry = registry
        self.metrics = metrics
        self.current: Job | None = None  # the job generating now (tests watch it)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._mean_seconds = 1.0  # moving average of generation times, for Retry-After
        # the machine's load changes while the server runs: plan the CPU threads per generation
        self._meter = CoreMeter() if settings.device == "cpu" else None
        self._plan: ThreadPlan | None = None  # as load_pair applied it, until the meter differs
        self._worker = threading.Thread(target=self._run, name="wmark-generate", daemon=True)
        self._worker.start()

    @classmethod
    def start(cls, settings: GenerationSettings, registry: KeyRegistry, metrics: Metrics) -> Generation:
        """Load the models (the method's drafter only if it speculates) and start the worker.

        Raises:
            WmarkError: the method is unknown or needs a drafter none was given for, a model
                does not load, or the server's key is missing or bound to another tokenizer.
        """
        assert settings.method is not None
        SamplerConfig(method=settings.method)  # validates the method name
        speculative = METHODS[settings.method].speculative
        if speculative and settings.drafter is None:
            raise WmarkError(f"method {settings.method} needs a drafter (--drafter)")
        name = settings.drafter if speculative else None
        pair = load_pair(
            settings.target,
            None if name is None else drafter_model_source(name, settings.target),
            device=settings.device,
            precision=settings.precision,
        )
        check_key_binding(registry.generation_key(settings.key_id), pair.target)  # fail at start-up
        drafter = None if name is None else build_drafter(name, pair.target, pair.drafter)
        return cls(settings, pair, registry, metrics, drafter)

    def key(self) -> KeyMaterial:
        """The key to generate with now (follows a rotation of the only active key)."""
        key = self.registry.generation_key(self.settings.key_id)
        check_key_binding(key, self.pair.target)
        return key

    def sampler(self, *, max_tokens: int, temperature: float, top_p: float) -> SamplerConfig:
        """The server's sampler with the request's budget, temperature and top-p."""
        assert self.settings.method is not None
        logits = LogitsConfig(temperature=temperature, top_k=self.settings.top_k, top_p=top_p)
        return SamplerConfig(
            method=self.settings.method,
            max_new_tokens=max_tokens,
            target_logits=logits,
            draft_logits=logits,
        )

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise `QueueFull`."""
        with self._lock:
            if self._waiting >= self.settings.max_queue:
                retry = self._mean_seconds * (self._waiting + 1)
                raise QueueFull(retry, self._waiting)
            self._waiting += 1
            self.metrics.queue_length.set(self._waiting)
        self._jobs.put(job)

    def close(self) -> None:
        """Cancel the running job, drop the waiting ones and stop the worker."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.send(Failed(WmarkError("the server is shutting down")))
        current = self.current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        self._worker.join(timeout=60)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self.metrics.queue_length.set(self._waiting)
            self.current = job
            try:
                job.send(self._serve(job))
            finally:
                self.current = None

    def _serve(self, job: Job) -> Finished | Failed:
        started = time.monotonic()
        if self._meter is not None and (plan := self._meter.plan()) is not None and plan != self._plan:
            log.info("CPU threads now: torch %d, int8 GEMM %d (%s wait)", *dataclasses.astuple(plan))
            self.pair.use_threads(plan)
            self._plan = plan
        try:
            result = generate(
                self.pair.target,
                job.prompt_ids,
                config=job.config,
                key=job.key,
                drafter=self.drafter,
                seed=job.seed,
                decode=self.pair.decode,
                on_emit=lambda ids: job.send(Tokens(tuple(ids))),
                should_stop=job.cancelled.is_set,
            )
            seq = self._audit(job, result)
        except Exception as exc:  # the worker must outlive any one request
            if not isinstance(exc, WmarkError):
                log.error("generation failed: %s", type(exc).__name__, exc_info=exc)
            return Failed(exc)
        with self._lock:
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - started)
        self.metrics.generated_tokens.inc(len(result.token_ids))
        self.metrics.generations.labels(result.stop_reason).inc()
        if result.blocks:
            self.metrics.aatps.observe(result.aatps)
        return Finished(result, seq)

    def _audit(self, job: Job, result: GenerationResult) -> int:
        """One row per generation: digests of prompt and output, key, counts; never the text."""
        entry = AuditEntry(
            actor=job.actor,
            action="generate",
            key_ids=(job.key.key_id,),
            text_sha256=text_digest(result.text),
            result={
                **job.audit,
                "model": self.settings.model_name,
                "method": result.method,
                "prompt_tokens": len(result.prompt_ids),
                "completion_tokens": len(result.token_ids),
                "finish_reason": result.stop_reason,
                "aatps": round(result.aatps, 4),
            },
        )
        (record,) = self.registry.audit.append(entry)
        return record.seq
