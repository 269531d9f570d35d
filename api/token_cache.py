"""Authenticated tokens remembered per process, so that a detection does not query the token table.

Checking a bearer token costs a database round trip (~0.75 ms on SQLite here) on every request.
The detection routes take the token's info from this cache instead and re-check revocation
where they must write anyway: inside the audit transaction that records their answer
(`AuditLog.append(precondition=TokenStore.ensure_unrevoked)`), and before any error they answer
instead (`admission.recheck`), so a revoked token is refused from the moment its revocation
commits, in every process, and no answer is given under it, not even which keys exist. Routes that
write no audit row authenticate against the database on every request.

Only successes are cached, keyed by the SHA-256 of the whole token (the token itself is not
kept), so a wrong secret for a cached id is still a miss and is checked in full.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from wmark.keys.tokens import TokenInfo, TokenStore

__all__ = ["TokenCache"]


class TokenCache:
    """`TokenStore.authenticate` with the successes remembered (least recently used dropped first).

    Args:
        store: the registry's token store.
        max_tokens: tokens remembered.
    """

    def __init__(self, store: TokenStore, max_tokens: int = 10_000) -> None:
        self._store = store
        self._max = max_tokens
        self._known: OrderedDict[str, TokenInfo] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, token: str | None) -> TokenInfo | None:
        """The token's info if it is in the cache, else None (no I/O: callable on the event loop)."""
        digest = _digest(token)
        with self._lock:
            info = self._known.get(digest)
            if info is not None:
                self._known.move_to_end(digest)
            return info

    def authenticate(self, token: str | None) -> TokenInfo:
        """The token's info (from the cache, or the database on a miss); raises `TokenRejected`."""
        info = self.cached(token)
        if info is not None:
            return info
        digest = _digest(token)
        info = self._store.authenticate(token)  # raises for a bad token: nothing is cached
        with self._lock:
            self._known[digest] = info
            while len(self._known) > self._max:
                self._known.popitem(last=False)
        return info

    def forget(self, token_id: str) -> None:
        """Drop every entry of this token id (after it was found revoked)."""
        with self._lock:
            for digest in [d for d, info in self._known.items() if info.token_id == token_id]:
                del self._known[digest]


def _digest(token: str | None) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest() if token else ""
