"""One loaded model pair and the queue in front of it: requests wait their turn, then generate.

A single worker thread owns the models (a model pair is neither thread-safe nor worth sharing: one
generation already keeps the cores busy). The event loop submits `Job`s and reads what the worker
sends back through the job's asyncio queue (`wmark.api.generation_job`): the tokens of each block,
then the result (after the audit row is written) or the error. A job whose client went away is
cancelled: the engine checks between blocks and stops. A job whose token or key was revoked is
stopped the same way, at its start or between blocks (`revocation`), and ends with that error. Every
job the worker takes is audited, however it ends. A streamed job's tokens reach the client before it
ends, so it is on record before the first of them: a `generate_start` row (the request, no output)
is written when it starts, and its end row names it (`start_seq`). If that row cannot be written the
job does not start, and a process killed mid-stream still leaves the start row. At most `max_queue`
jobs wait behind the running one (0: none wait); one more is refused with `QueueFull` (429,
Retry-After from the recent generation times).

Prompts are tokenised on a small pool of their own (`tokenise`), off the event loop and off the
threads that `def` routes and authentication share: a flood of big prompts waits there, and the
service goes on answering everything else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.exc import OperationalError

from wmark.api import revocation
from wmark.api.errors import RateLimited
from wmark.api.generate_settings import GenerationSettings
from wmark.api.generation_job import Failed, Finished, Job, Tokens
from wmark.api.metrics import Metrics
from wmark.errors import KeyRegistryError, KeyRevokedError, WmarkError
from wmark.generator.backend import LanguageModel
from wmark.generator.cpu.threads import CoreMeter, ThreadPlan
from wmark.generator.drafters.build import build_drafter, drafter_model_source
from wmark.generator.engine import METHODS, SamplerConfig, check_key_binding, generate
from wmark.generator.models.loading import ModelPair, load_pair
from wmark.generator.result import GenerationResult
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry
from wmark.keys.audit import AuditEntry, text_digest

__all__ = ["Generation", "GenerationFailed", "NoGenerationKey", "QueueFull"]

log = logging.getLogger("wmark.api")
T = TypeVar("T")
TOKENISING_THREADS = 2  # prompts tokenised at once (tokenizers releases the GIL in encode_batch)


class QueueFull(RateLimited):
    """Every place in the generation queue is taken."""

    code = "queue_full"

    def __init__(self, retry_after: float, waiting: int, *, mine: bool = False) -> None:
        seconds = max(1, math.ceil(retry_after))
        # the Retry-After header rounds `retry_after + 0.5` (api.errors): from n - 0.5 it says n
        super().__init__(seconds - 0.5)
        if mine:
            self.args = (f"this token holds as many places in the generation queue as one token may; "
                         f"retry in {seconds} s",)  # fmt: skip
        else:
            self.args = (f"the generation queue is full ({waiting} waiting); retry in {seconds} s",)


_ROTATIONS = 1000  # rotations followed from `--key` (a bound: a damaged registry could loop)


class NoGenerationKey(WmarkError):
    """The server has no key to generate with now (see `Generation.key`)."""

    code = "no_generation_key"
    status = 503

    def __init__(self) -> None:
        super().__init__("this server has no watermark key to generate with; its operator must set one")


class GenerationFailed(WmarkError):
    """The generation (or the tokenising of its prompt) raised something unexpected; it is logged."""

    code = "internal_error"
    status = 500

    def __init__(self) -> None:
        super().__init__("the generation failed (logged on the server)")


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
        # under the lock: the jobs waiting (not withdrawn, not yet taken), and the places held
        # (waiting or running) per token
        self._queued: set[Job] = set()
        self._per_token: Counter[str] = Counter()
        self.tokenising_threads = TOKENISING_THREADS
        self._tokeniser = ThreadPoolExecutor(TOKENISING_THREADS, thread_name_prefix="wmark-tokenise")
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
        """The key to generate with now: it follows a rotation, of the only active key or of the
        one `--key` named (to its active successor). A revoked key is refused (409 `key_revoked`);
        where there is no key (none that generates, several active, the named one gone) the
        server is misconfigured: 503, the detail in the log, not the key ids in the answer."""
        try:
            key = self.registry.generation_key(self._successor(self.settings.key_id))
        except KeyRevokedError:  # the served key itself was revoked: 409, as its jobs are told
            raise
        except KeyRegistryError as exc:
            log.error("no key to generate with: %s", exc)
            raise NoGenerationKey() from None
        check_key_binding(key, self.pair.target)
        return key

    def _successor(self, key_id: str | None) -> str | None:
        """`key_id`, or the key its rotations led to (a chain of at most `_ROTATIONS`)."""
        for _ in range(_ROTATIONS):
            info = self.registry.get(key_id) if key_id is not None else None
            if info is None or info.status != "retired" or info.replaced_by is None:
                break
            key_id = info.replaced_by
        return key_id

    async def tokenise(self, work: Callable[[], T]) -> T:
        """`work()` (a prompt's tokenising) on the tokenising pool; an unexpected error of the
        tokenizer or the template is logged and raised as `GenerationFailed`."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._tokeniser, work)
        except WmarkError:
            raise
        except Exception as exc:
            log.error("tokenising failed: %s", type(exc).__name__, exc_info=exc)
            raise GenerationFailed() from None

    def ensure_room(self, token_id: str) -> None:
        """Raise `QueueFull` if `submit` would now (so a prompt is not tokenised for nothing)."""
        with self._lock:
            self._refuse_if_full(token_id)

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise `QueueFull`."""
        with self._lock:
            self._refuse_if_full(job.token_id)
            self._per_token[job.token_id] += 1
            self._queued.add(job)
            self.metrics.queue_length.set(len(self._queued))
        job.on_cancel = self._withdraw
        self._jobs.put(job)

    def _refuse_if_full(self, token_id: str) -> None:
        """Under the lock: one job may run and `max_queue` wait behind it, at most
        `queue_per_token` of them one token's."""
        admitted, waiting = self._per_token.total(), len(self._queued)
        if admitted >= self.settings.max_queue + 1:
            raise QueueFull(self._mean_seconds * admitted, waiting)
        if self._per_token[token_id] >= (self.settings.queue_per_token or 1):
            raise QueueFull(self._mean_seconds * self._per_token[token_id], waiting, mine=True)

    def _withdraw(self, job: Job) -> None:
        """A waiting job's client went away: its place is free now (the worker skips it)."""
        with self._lock:
            if job not in self._queued:  # running, finished or withdrawn already
                return
            self._queued.discard(job)
            self._release(job)
            self.metrics.queue_length.set(len(self._queued))

    def _release(self, job: Job) -> None:
        """Under the lock: `job` no longer holds a place."""
        self._per_token[job.token_id] -= 1
        if not self._per_token[job.token_id]:
            del self._per_token[job.token_id]

    def close(self) -> None:
        """Cancel the running job, drop the waiting ones and stop the worker."""
        self._tokeniser.shutdown(wait=False, cancel_futures=True)
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
                withdrawn = job not in self._queued
                self._queued.discard(job)
                self.metrics.queue_length.set(len(self._queued))
            if withdrawn:  # its client left while it waited: on record, as any cancelled job
                self._record_withdrawn(job)
                continue
            self.current = job
            try:
                job.send(self._serve(job))
            finally:
                self.current = None
                with self._lock:
                    self._release(job)

    def _record_withdrawn(self, job: Job) -> None:
        try:
            self._audit(job, None, "cancelled")
        except Exception as exc:  # the worker must outlive any one request
            log.error("generation not audited: %s", type(exc).__name__)
        self.metrics.generations.labels("cancelled").inc()

    def _serve(self, job: Job) -> Finished | Failed:
        started = time.monotonic()
        if self._meter is not None and (plan := self._meter.plan()) is not None and plan != self._plan:
            log.info("CPU threads now: torch %d, int8 GEMM %d (%s wait)", *dataclasses.astuple(plan))
            self.pair.use_threads(plan)
            self._plan = plan
        result: GenerationResult | None = None
        try:
            self._start(job)  # may move the job to its key's successor
            # audited, so answered or streamed, only if neither was revoked since the last check
            allowed = functools.partial(
                revocation.ensure_allowed, token_id=job.token_id, key_id=job.key.key_id
            )
            if job.stream:  # on record before its first token leaves
                job.start_seq = self._audit_start(job, precondition=allowed)
            result = generate(
                self.pair.target,
                job.prompt_ids,
                config=job.config,
                key=job.key,
                drafter=self.drafter,
                seed=job.seed,
                decode=self.pair.decode,
                on_emit=lambda ids: job.send(Tokens(tuple(ids))),
                should_stop=lambda: self._should_stop(job),
            )
            if job.stopped is not None:
                raise job.stopped
            seq = self._audit(job, result, result.stop_reason, precondition=allowed)
        except Exception as exc:  # the worker must outlive any one request
            return self._failed(job, exc, result)
        with self._lock:
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - started)
        self.metrics.generated_tokens.inc(len(result.token_ids))
        self.metrics.generations.labels(result.stop_reason).inc()
        if result.blocks:
            self.metrics.aatps.observe(result.aatps)
        return Finished(result, seq)

    def _start(self, job: Job) -> None:
        """The job's token and key as they are now: revoked, it does not start; its key rotated
        while it waited, it generates with the successor."""
        if revocation.check(self.registry, job.token_id, job.key.key_id) == "retired":
            job.key = self.key()

    def _should_stop(self, job: Job) -> bool:
        """Before each block: the client went away, or the token or the key was revoked."""
        if job.cancelled.is_set():
            return True
        try:
            revocation.check(self.registry, job.token_id, job.key.key_id)
        except (revocation.TokenRevoked, KeyRevokedError) as exc:
            job.stopped = exc
            return True
        return False

    def _failed(self, job: Job, error: Exception, result: GenerationResult | None = None) -> Failed:
        """Audit a generation that did not finish (why, and what it had emitted), and say why.

        A revocation's finish reason is its code ("token_revoked", "key_revoked"); anything else
        is "error", with the error's code. An error that is neither wmark's nor the database's
        is logged and answered as `GenerationFailed`, so the client gets OpenAI's error shape.
        """
        if not isinstance(error, (WmarkError, OperationalError)):
            log.error("generation failed: %s", type(error).__name__, exc_info=error)
            error = GenerationFailed()
        revoked = isinstance(error, (revocation.TokenRevoked, KeyRevokedError))
        code = error.code if isinstance(error, WmarkError) else "database_unavailable"
        reason = code if revoked else "error"
        try:
            self._audit(job, result, reason, error=None if revoked else code)
        except Exception as exc:  # the database is gone too: the error still goes to the client
            log.error("generation not audited: %s", type(exc).__name__)
        self.metrics.generations.labels(reason).inc()
        return Failed(error)

    def _audit(
        self,
        job: Job,
        result: GenerationResult | None,
        finish_reason: str,
        *,
        error: str | None = None,
        precondition: Callable[[Any], None] | None = None,
    ) -> int:
        """One row per job the worker took: digests of prompt and output, key, counts, how it
        ended; never the text. `precondition` runs in the row's transaction (`AuditLog.append`)."""
        outcome: dict[str, Any] = {
            **self._request(job),
            "completion_tokens": len(result.token_ids) if result is not None else 0,
            "finish_reason": finish_reason,
        }
        if job.start_seq is not None:
            outcome["start_seq"] = job.start_seq
        if result is not None:
            outcome["aatps"] = round(result.aatps, 4)
        if error is not None:
            outcome["error"] = error
        entry = AuditEntry(
            actor=job.actor,
            action="generate",
            key_ids=(job.key.key_id,),
            text_sha256=text_digest(result.text) if result is not None else None,
            result=outcome,
        )
        (record,) = self.registry.audit.append(entry, precondition=precondition)
        return record.seq

    def _audit_start(self, job: Job, *, precondition: Callable[[Any], None]) -> int:
        """The `generate_start` row of a streamed job: the request and the key, no output yet."""
        entry = AuditEntry(
            actor=job.actor, action="generate_start", key_ids=(job.key.key_id,), result=self._request(job)
        )
        (record,) = self.registry.audit.append(entry, precondition=precondition)
        return record.seq

    def _request(self, job: Job) -> dict[str, Any]:
        """What both of a job's rows say of the request."""
        return {
            **job.audit,
            "stream": job.stream,
            "model": self.settings.model_name,
            "method": job.config.method,
            "prompt_tokens": len(job.prompt_ids),
        }
