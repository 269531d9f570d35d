"""Cached detectors: tokenizers are parsed once per process, detectors rebuilt only when keys change.

Building a `Detector` from the registry decrypts every key, and parsing a tokenizer.json takes
~0.3 s for a 150k-token vocabulary. A request takes the cached detector without asking the
database; whether the keys it was built from are still the registry's keys is checked where the
request writes anyway: in the transaction of its audit row (`KeySet.unchanged`, one query per
group commit), under the write lock that every key change also takes. When another process (or
this one) created, rotated or revoked a key meanwhile, the answer is not given: the route
rebuilds the detectors and detects again.

A key whose secret the master key cannot open (sealed under another master key) is left out of
the detectors, and each answer names it with its error (`KeySet.skipped`): detection with the
other keys goes on. Only when every key asked for is left out is the request refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from wmark.detector import Detector, TextTokenizer, readings
from wmark.errors import KeyRegistryError, TokenizerError
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry
from wmark.keys.registry import SkippedKey, no_usable_key

__all__ = ["DetectorCache", "KeySet", "KeysChanged", "NoKeysError"]


class NoKeysError(KeyRegistryError):
    """The registry has no active or retired key (a state of the service, not a bad request)."""

    code = "no_keys"
    status = 409


class KeysChanged(KeyRegistryError):
    """The keys changed between detecting and auditing, on every attempt of one request."""

    code = "keys_changed"
    status = 409


_MAX_SUBSETS = 64
_KEY_STATE = "wmark.api.key_state"  # session.info: the key state read in this transaction
KeyState = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class KeySet:
    """A detector, the registry's key state it was built from, and the keys left out of it."""

    detector: Detector
    state: KeyState
    registry: KeyRegistry
    skipped: tuple[SkippedKey, ...] = ()

    def unchanged(self, session: Session) -> None:
        """In the audit transaction: raise `KeysChanged` if the keys are no longer `state`.

        The state is read once per transaction (`session.info`): key changes take the same
        write lock, so it cannot change while the transaction holds it.
        """
        current: KeyState | None = session.info.get(_KEY_STATE)
        if current is None:
            current = session.info[_KEY_STATE] = self.registry.key_state(session)
        if current != self.state:
            raise KeysChanged("the keys changed while this request was answered; send it again")


class _Tokenizers:
    """Parsed tokenizers by SHA-256, shared by every detector of the process (content-addressed)."""

    def __init__(self, load: Callable[[str], bytes]) -> None:
        self._load = load
        self._parsed: dict[str, TextTokenizer] = {}
        self._lock = threading.Lock()

    def get(self, sha256: str) -> TextTokenizer:
        with self._lock:
            tok = self._parsed.get(sha256)
            if tok is None:
                tok = TextTokenizer(self._load(sha256), sha256[:12])
                if tok.sha256 != sha256:
                    raise TokenizerError(f"tokenizer content does not match its hash {sha256[:12]}")
                self._parsed[sha256] = tok
            return tok


class _SharedDetector(Detector):
    """A `Detector` that takes its tokenizers from the process-wide cache."""

    def __init__(self, keys: Sequence[KeyMaterial], tokenizers: _Tokenizers) -> None:
        super().__init__(keys)
        self._shared = tokenizers

    def tokenizer(self, sha256: str) -> TextTokenizer:
        return self._shared.get(sha256)


class DetectorCache:
    """Detectors for all detection keys, or for a requested subset, kept until the keys change.

    Args:
        registry: the service's registry.
        on_build: called each time the key set changed and detectors were rebuilt (metrics).
    """

    def __init__(self, registry: KeyRegistry, on_build: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.builds = 0
        self._on_build = on_build
        self._tokenizers = _Tokenizers(registry.tokenizer_json)
        self._lock = threading.Lock()
        self._state: tuple[tuple[str, str], ...] | None = None
        self._keys: dict[str, KeyMaterial] = {}
        self._skipped: dict[str, SkippedKey] = {}
        self._subsets: dict[tuple[str, ...], tuple[Detector, tuple[SkippedKey, ...]]] = {}

    def warm(self) -> None:
        """Build the default detector, parse its tokenizers and build their splice tables and the
        normaliser's tables now (at start-up, not on a request: the tables take seconds on a busy
        machine, the normaliser's ~0.1 s on the first text with edit marks)."""
        if not self.registry.key_state():
            return
        detector = self.get(refresh=True).detector
        for sha256 in {k.spec.tokenizer.sha256 for k in detector.keys}:
            _ = detector.tokenizer(sha256).splice_tables
        readings.warm_tables()

    def get(self, key_ids: Sequence[str] | None = None, *, refresh: bool = False) -> KeySet:
        """The detector for `key_ids` (default: every active and retired key), as of the key state
        last read; `refresh` (or no key known yet) reads the state again first.

        Raises:
            KeyNotFoundError, KeyRevokedError: a requested key is unknown or revoked.
            KeyUnavailableError, WrongMasterKeyError: every key asked for is left out.
            NoKeysError: there is no key to detect with.
        """
        state = self.registry.key_state() if refresh or not self._state else None
        with self._lock:
            if state is not None and state != self._state:
                keys, skipped = self.registry.open_detection_keys()
                self._keys = {k.key_id: k for k in keys}
                self._skipped = {s.key_id: s for s in skipped}
                self._subsets.clear()
                self._state = state
                self.builds += 1
                if self._on_build is not None:
                    self._on_build()
            wanted = tuple(dict.fromkeys(key_ids)) if key_ids else (*self._keys, *self._skipped)
            built = self._subsets.get(wanted)
            if built is None:
                built = self._build(wanted, requested=bool(key_ids))
                if len(self._subsets) >= _MAX_SUBSETS:
                    self._subsets.pop(next(iter(self._subsets)))
                self._subsets[wanted] = built
            assert self._state is not None  # set above: `not self._state` forced a read
            return KeySet(built[0], self._state, self.registry, built[1])

    def _build(self, wanted: tuple[str, ...], *, requested: bool) -> tuple[Detector, tuple[SkippedKey, ...]]:
        """The detector of the keys `wanted` that open, and those left out (under `_lock`)."""
        for key_id in wanted:
            if key_id not in self._keys and key_id not in self._skipped:
                # not a detection key as of the state read: raises the precise error (unknown,
                # revoked), or the key is one the master key cannot open
                keys, skipped = self.registry.open_detection_keys([key_id])
                self._keys.update((k.key_id, k) for k in keys)
                self._skipped.update((s.key_id, s) for s in skipped)
        usable = [self._keys[k] for k in wanted if k in self._keys]
        left_out = tuple(self._skipped[k] for k in wanted if k in self._skipped)
        if not usable:
            if left_out:
                raise no_usable_key(left_out, requested=requested)
            raise NoKeysError("no keys to detect with: create one with `wmark keys create NAME`")
        return _SharedDetector(usable, self._tokenizers), left_out
