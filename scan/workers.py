"""Where a scan's detection runs: in this process, a local process pool, or a Dask cluster.

Each worker process builds its `Localizer` once (pool initializer, or cached per process on
Dask workers, keyed by the scan's token) from a `WorkerConfig`: the keys as `KeyMaterial` (the
secret pickles, is never logged) and the tokenizers' JSON. Work travels in batches of
documents; each batch returns one `ScanRow` per document. Tokenisation inside a worker is
single-threaded, so N workers use N cores. dask.distributed is imported only for `--dask`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import logging
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol

from wmark.detector.detect import Detector
from wmark.detector.localize import Localization, Localizer
from wmark.errors import InputError, WmarkError
from wmark.keymaterial import KeyMaterial
from wmark.scan.rows import ScanRow

__all__ = [
    "Batch",
    "DaskExecutor",
    "Executor",
    "InlineExecutor",
    "PoolExecutor",
    "WorkerConfig",
    "detect_batch",
]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What every worker needs to detect (shipped to it once).

    Attributes:
        keys: the keys to test.
        tokenizers: tokenizer.json bytes by SHA-256, for the keys' tokenizers.
        alpha: significance level per document.
        min_window: shortest window in scored positions (0: whole documents only).
        token: identifies this configuration in a worker's cache.
    """

    keys: tuple[KeyMaterial, ...]
    tokenizers: dict[str, bytes]
    alpha: float
    min_window: int
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __repr__(self) -> str:
        keys = [k.key_id for k in self.keys]
        return f"WorkerConfig(keys={keys}, alpha={self.alpha}, min_window={self.min_window})"

    def build(self) -> Localizer:
        """The localizer for these settings (parses the tokenizers)."""
        detector = Detector(list(self.keys), self.tokenizers)
        for sha in {k.spec.tokenizer.sha256 for k in self.keys}:
            detector.tokenizer(sha)
        return Localizer(detector, min_window=self.min_window)


# (source, doc_id, text) of each document of a batch
Batch = tuple[tuple[str, str, str], ...]


def detect_batch(localizer: Localizer, alpha: float, batch: Batch) -> list[ScanRow]:
    """One row per document of the batch, in order; a document that fails gets an error row.

    The batch is tokenised in one call for speed; if that call fails on anything but a
    per-document `WmarkError` (one text the tokenizer rejects fails the whole call), each
    document is tested alone, so the failure becomes that document's error row and the others
    still get their verdicts.
    """
    texts = [text for _, _, text in batch]
    found: list[Localization | Exception]
    try:
        found = list(localizer.localize_many(texts, alpha=alpha))
    except Exception:
        found = [_localize_one(localizer, alpha, text) for text in texts]
    rows = []
    for (source, doc_id, _), result in zip(batch, found, strict=True):
        if isinstance(result, WmarkError):
            rows.append(ScanRow.failed(source, doc_id, str(result)))
        elif isinstance(result, Exception):
            message = f"detection failed ({type(result).__name__}: {result})"[:500]
            rows.append(ScanRow.failed(source, doc_id, message))
        else:
            rows.append(ScanRow.detected(source, doc_id, result))
    return rows


def _localize_one(localizer: Localizer, alpha: float, text: str) -> Localization | Exception:
    try:
        return localizer.localize_many([text], alpha=alpha)[0]
    except Exception as exc:  # this document's own failure, reported in its row
        return exc


_CACHE: dict[str, Localizer] = {}  # per worker process, by WorkerConfig.token
_CACHED_SCANS = 4  # a Dask worker may serve a few scans; each localizer holds parsed tokenizers


def _single_threaded() -> None:
    # One core per worker: the tokenizer would otherwise start a thread per core in each worker.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_WATCH_SECONDS = 1.0  # how often the portable watchdog looks at the driver


def _exit_with_driver(driver: int) -> None:
    """End this worker process when the scan's driver process `driver` ends, even by SIGKILL.

    A pool's workers would otherwise outlive a killed driver (re-parented to init, blocked on a
    task queue that other workers keep open) and hold their memory forever. On Linux the kernel
    kills this process when its parent (the fork server, or the driver itself) exits
    (PR_SET_PDEATHSIG), and a thread waits on a pidfd of the driver; elsewhere, or on kernels
    without pidfds, the thread looks every second whether the driver still exists and whether
    this process was re-parented.
    """
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):  # no usable libc: the thread still watches
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    watch = threading.Thread(
        target=_watch_driver, args=(driver, os.getppid()), name="wmark-watch", daemon=True
    )
    watch.start()


def _watch_driver(driver: int, parent: int) -> None:
    try:
        pidfd = os.pidfd_open(driver)
    except ProcessLookupError:
        os._exit(1)  # already gone
    except (AttributeError, OSError):  # not Linux >= 5.3: poll
        while _exists(driver) and os.getppid() == parent:
            time.sleep(_WATCH_SECONDS)
        os._exit(1)
    watch = select.poll()
    watch.register(pidfd, select.POLLIN)
    watch.poll()  # readable once the driver has exited
    os._exit(1)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        pass
    return True


def _pool_init(config: WorkerConfig, driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    _exit_with_driver(driver)
    _single_threaded()
    _CACHE[config.token] = config.build()


def _pool_batch(token: str, alpha: float, batch: Batch) -> list[ScanRow]:
    return detect_batch(_CACHE[token], alpha, batch)


def _dask_batch(config: WorkerConfig, batch: Batch) -> list[ScanRow]:
    localizer = _CACHE.get(config.token)
    if localizer is None:
        _single_threaded()
        while len(_CACHE) >= _CACHED_SCANS:
            _CACHE.pop(next(iter(_CACHE)))
        localizer = _CACHE[config.token] = config.build()
    return detect_batch(localizer, config.alpha, batch)


class Executor(Protocol):
    """Runs batches; futures follow `concurrent.futures.Future` (`result()`, `done()`).

    Attributes:
        slots: batches it runs at once.
        generation: bumped by each `restart`, so a scan restarts once per failure.
    """

    slots: int
    generation: int

    def submit(self, batch: Batch) -> Any:
        """Start a batch; returns its future."""

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        """The futures that are done, waiting up to `timeout` seconds for the first one."""

    def restart(self) -> None:
        """Recover after a worker died (new processes); pending futures are lost."""

    def close(self) -> None:
        """Stop the workers (cancelling what is still queued)."""


class InlineExecutor:
    """Runs each batch at submission, in this process (`--workers 0`; tests and debugging)."""

    slots = 1
    generation = 0

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._localizer = config.build()

    def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
        """Run the batch now."""
        future: cf.Future[list[ScanRow]] = cf.Future()
        try:
            future.set_result(detect_batch(self._localizer, self.config.alpha, batch))
        except Exception as exc:  # reported as error rows by the scan, like a worker's failure
            future.set_exception(exc)
        return future

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:  # noqa: ARG002
        """Everything is already done."""
        return list(futures)

    def restart(self) -> None:
        """Nothing to restart."""

    def close(self) -> None:
        """Nothing to stop."""


def _worker_context() -> multiprocessing.context.BaseContext:
    # Worker processes are forked from a fork server: a clean, single-threaded process (so the
    # driver's threads are never forked) that has imported the main module and this one once,
    # instead of every worker importing them again as spawned processes do. Spawn where there is
    # no fork server (Windows).
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", __name__])
    return context


class PoolExecutor:
    """A local pool of worker processes, forked from a fork server (see `_worker_context`).

    Args:
        config: shipped to each worker once, at its start.
        workers: number of processes.
    """

    def __init__(self, config: WorkerConfig, workers: int) -> None:
        if workers < 1:
            raise InputError(f"--workers must be >= 0, got {workers}")
        self.config = config
        self.slots = workers
        self.generation = 0
        self._pool = self._new_pool()

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.slots,
            mp_context=_worker_context(),
            initializer=_pool_init,
            initargs=(self.config, os.getpid()),
        )

    def submit(self, batch: Batch) -> cf.Future[list[ScanRow]]:
        """Queue a batch."""
        return self._pool.submit(_pool_batch, self.config.token, self.config.alpha, batch)

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        """Done futures, after waiting for the first; a broken pool's error says how its
        worker died (`_deaths`), which `BrokenProcessPool` itself does not."""
        done, _ = cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        for future in done:
            exc = future.exception()
            noted = getattr(exc, "__notes__", None)  # every future of the broken pool shares it
            if isinstance(exc, BrokenProcessPool) and not noted and (deaths := _deaths(self._pool)):
                exc.add_note(deaths)
        return list(done)

    def restart(self) -> None:
        """Replace a broken pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        self.generation += 1

    def close(self) -> None:
        """Cancel queued batches and stop the processes."""
        self._pool.shutdown(wait=True, cancel_futures=True)


REAP_WAIT = 10.0
"""Seconds `_deaths` waits for a broken pool's manager thread to reap its workers."""


def _deaths(pool: cf.ProcessPoolExecutor) -> str | None:
    """How the pool's worker processes that died ended, e.g. "a worker process was killed by
    SIGKILL (the kernel's out-of-memory killer?)"; None when unknown.

    Reads the pool's process table (`_processes`, not public API; absent, nothing is said). The
    pool ends its other workers with SIGTERM once it is broken: those are not the cause.

    It first waits for the pool's manager thread (`_executor_manager_thread`), which fails the
    futures and then ends and joins the workers: reading a worker's exit status while that
    thread joins it races, as a forkserver worker's status is one message on a pipe and the
    second of two readers gets EOF, which multiprocessing reports as exit code 255 (CI saw "a
    worker process exited with code 255" for a worker killed by SIGABRT).
    """
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(REAP_WAIT)
    processes = getattr(pool, "_processes", None) or {}
    codes = sorted({p.exitcode for p in list(processes.values())} - {None, 0, -signal.SIGTERM})
    return "; ".join(_exit_text(code) for code in codes) or None


def _exit_text(code: int) -> str:
    if code >= 0:
        return f"a worker process exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = {"SIGKILL": " (the kernel's out-of-memory killer?)", "SIGABRT": " (a failed memory allocation?)"}
    return f"a worker process was killed by {name}{hint.get(name, '')}"


class DaskExecutor:
    """Batches on a Dask cluster: a scheduler address, or "local" for a LocalCluster here.

    Args:
        config: scattered to every worker once; each worker process builds its localizer from
            it on first use.
        address: "local", or a scheduler address such as tcp://host:8786 (use tls:// across
            machines: the keys' secrets travel to the workers).
        workers: processes of a LocalCluster (ignored for a remote scheduler).
        connect_timeout: seconds to wait for a remote scheduler.

    Raises:
        InputError: dask.distributed is not installed or the scheduler cannot be reached.
    """

    def __init__(
        self, config: WorkerConfig, address: str, workers: int, *, connect_timeout: float = 10.0
    ) -> None:
        try:
            import distributed as distributed_module
        except ImportError as exc:
            raise InputError("--dask needs the scan extra: pip install 'wmark[scan]'") from exc
        distributed: Any = distributed_module  # partly typed; used through its documented API only
        self._distributed = distributed
        self.config = config
        self.generation = 0
        self._cluster: Any = None
        try:
            if address == "local":
                self._cluster = distributed.LocalCluster(
                    n_workers=max(workers, 1),
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    # closing races log heartbeat errors; task failures still reach the futures
                    silence_logs=logging.CRITICAL,
                )
                self._client = distributed.Client(self._cluster)
            else:
                self._client = distributed.Client(address, timeout=connect_timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            if self._cluster is not None:
                self._cluster.close()
            raise InputError(f"--dask {address}: cannot reach the scheduler ({exc})") from exc
        self.slots = max(sum(self._client.nthreads().values()), 1)
        self._config_future = self._client.scatter(config, broadcast=True, hash=False)
        self._count = 0

    def submit(self, batch: Batch) -> Any:
        """Queue a batch on the cluster."""
        self._count += 1
        key = f"wmark-scan-{self.config.token[:12]}-{self._count}"
        return self._client.submit(_dask_batch, self._config_future, batch, key=key, pure=False)

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        """Done futures, after waiting for the first."""
        with contextlib.suppress(TimeoutError):
            self._distributed.wait(list(futures), timeout=timeout, return_when="FIRST_COMPLETED")
        return [f for f in futures if f.done()]

    def restart(self) -> None:
        """Nothing to do: the scheduler reschedules the tasks of a lost worker itself."""

    def close(self) -> None:
        """Cancel queued batches, disconnect, and stop a LocalCluster."""
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
