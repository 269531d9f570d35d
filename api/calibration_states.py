"""Which detection keys were never calibrated (or under another spec), cached off the detection path.

Every detection answer names the keys it tested whose false-positive rate was never measured on
the user's text (`wmark calibrate`), or was measured under another spec
(`calibration_warnings`). The states come from the registry (`CalibrationStore.states`, two
queries), read at most once per `ttl` seconds per process and whenever a key not seen before is
asked about; a request in between takes them from memory. A calibration made elsewhere shows up
in the answers within `ttl` seconds: the warning is advice, and a request must not wait on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from wmark.keys.calibrations import CalibrationState, CalibrationStore

__all__ = ["CalibrationStates"]

TTL_S = 30.0


class CalibrationStates:
    """The calibration state of the keys detection uses, refreshed every `ttl` seconds.

    Args:
        store: the registry's calibrations.
        ttl: seconds a state read from the registry is used for.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, store: CalibrationStore, *, ttl: float = TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, CalibrationState] = {}
        self._read_at = -float("inf")

    def warnings(self, key_ids: Sequence[str]) -> list[dict[str, Any]]:
        """`{"key_id", "state"}` for each of `key_ids` never calibrated ("uncalibrated") or
        calibrated under another spec ("stale"), in the given order."""
        with self._lock:
            now = self._clock()
            if now - self._read_at >= self._ttl or any(k not in self._states for k in key_ids):
                self._states = self._store.states(sorted({*self._states, *key_ids}))
                self._read_at = now
            states = self._states
        return [
            {"key_id": k, "state": states[k]} for k in key_ids if states.get(k, "calibrated") != "calibrated"
        ]

    def forget(self) -> None:
        """Read the states again at the next request."""
        with self._lock:
            self._read_at = -float("inf")
