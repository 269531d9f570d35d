"""A circuit breaker: stop calling a backing service that keeps failing, and probe it now and then.

Redis that accepts connections and never answers costs every call its full socket timeout; a
breaker turns that into a few slow calls, after which callers skip the service (and use their
fallback) for `reset_after` seconds. Then one caller probes it (half-open): success closes the
breaker, failure opens it for another `reset_after` seconds. Thread-safe: the service's threads
share one breaker per backing service.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]

log = logging.getLogger("wmark.api")


class CircuitBreaker:
    """Closed (calls go through), open (calls are skipped) or half-open (one probe in flight).

    Args:
        name: what is behind it, for the log.
        fallback: what callers do meanwhile, for the log.
        failures: consecutive failures that open the breaker.
        reset_after: seconds it stays open before one call may probe the service again.
        on_open: called each time it opens (a metric).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        name: str,
        fallback: str,
        failures: int,
        reset_after: float,
        *,
        on_open: Callable[[], object] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._fallback = fallback
        self._threshold = failures
        self._reset_after = reset_after
        self._on_open = on_open
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until: float | None = None  # None: closed
        self._probing = False

    @property
    def is_open(self) -> bool:
        """Open or half-open: callers should not count on the service."""
        return self._open_until is not None

    def allow(self) -> bool:
        """Whether this call may go to the service: always when closed; when open, only the one
        probe after `reset_after` seconds (a caller that gets True must report `succeeded` or
        `failed`)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        """The call went through: the breaker closes."""
        with self._lock:
            was_open = self._open_until is not None
            self._failures, self._open_until, self._probing = 0, None, False
        if was_open:
            log.warning("%s answers again: breaker closed", self.name)

    def failed(self) -> None:
        """The call failed or timed out: the breaker opens at the threshold, or again after a probe."""
        with self._lock:
            self._failures += 1
            if self._probing or (self._open_until is None and self._failures >= self._threshold):
                opened = self._open_until is None
                self._open_until = self._clock() + self._reset_after
                self._probing = False
            else:
                return
        if opened:  # logged once per outage, not at each failed probe
            self._on_open()
            log.warning(
                "%s failed %d times in a row: breaker open, probed every %g s; meanwhile %s",
                self.name,
                self._threshold,
                self._reset_after,
                self._fallback,
            )
