"""Keyed randomness: per-context seeds (HMAC-SHA256) and the clocks' uniforms (Philox-4x32-10).

PRF v1, the whole definition (tests/vectors/prf_v1.json pins it):

    seed(c)  = HMAC-SHA256(secret, tag || be32(spec_version) || be32(id) for id in label(c))
    U(v, j)  = (x + 1/2) * 2^-52,  x = top 52 bits of (out[1] << 32 | out[0]),
               out = Philox4x32-10(counter = (v, j, w2, w3), key = (w0, w1)),
               w0..w3 = the seed's first 16 bytes as little-endian uint32

U(v, j) is the uniform of the j-th arrival (j >= 1) of token v's clock at that context. It is a
pure function of (seed, v, j): prefix consistent, whatever vocabulary slice or number of
arrivals a caller asks for. `E = -ln U` are the clock's exponential gaps.

Three label families share the construction and differ by domain tag:
  - keyed window (tag "wmark.ctx"): label = the h previous token IDs;
  - keyed prefix (tag "wmark.pfx"): label = every previous token ID (paper replication);
  - free (tag "wmark.free", secret = a per-request nonce): label = (position, window), the
    unkeyed source used at repeated contexts, for diversity, and by `pfr-nowm`.

This module is the numpy reference; `wmark._fastprf` (C) computes the same pivots many times
faster for the detector, and `wmark.generator.cuda.prf` ports `philox_uniforms` to torch.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from wmark.errors import SpecError
from wmark.secret import Secret

if TYPE_CHECKING:
    from wmark.spec import WatermarkSpec

__all__ = [
    "FREE_TAG",
    "PREFIX_TAG",
    "WINDOW_TAG",
    "FreeSource",
    "KeyedSource",
    "fast_backend",
    "philox4x32_10",
    "seed_uniforms",
    "seed_uniforms_reference",
    "first_occurrence",
    "first_occurrence_reference",
    "window_pivots",
    "window_pivots_reference",
]

WINDOW_TAG = b"wmark.ctx"
PREFIX_TAG = b"wmark.pfx"
FREE_TAG = b"wmark.free"

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_TWO_POW_M52 = 2.0**-52

_fastprf: ModuleType | None
try:  # the compiled fast path; the *_reference functions define it and tests compare the two
    import wmark._fastprf as _fastprf
except ImportError:  # pragma: no cover - only on an install built without a C compiler
    _fastprf = None


def fast_backend() -> str:
    """Which implementation computes detector pivots: 'sha-ni', 'portable' (C) or 'python'."""
    return _fastprf.backend() if _fastprf is not None else "python"


def _be32_words(ids: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("token IDs must fit in 32 bits")
    return arr.astype(">u4").tobytes()


def _hmac_key(secret: Secret | bytes) -> bytes:
    raw = secret.reveal() if isinstance(secret, Secret) else secret
    # HMAC hashes keys longer than a block; doing it here lets the C path take <= 64 bytes.
    return hashlib.sha256(raw).digest() if len(raw) > 64 else raw


def philox4x32_10(counters: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Philox-4x32-10 (Salmon et al. 2011), vectorised.

    Args:
        counters: (n, 4) uint64 holding 32-bit words.
        keys: (n, 2) uint64 holding 32-bit words.

    Returns:
        (n, 4) uint64 holding the 32-bit output words.
    """
    c0, c1, c2, c3 = (counters[:, i].astype(np.uint64) for i in range(4))
    k0, k1 = keys[:, 0].astype(np.uint64), keys[:, 1].astype(np.uint64)
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0  # < 2^64: exact in uint64
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & _MASK32,
        )
    return np.stack([c0, c1, c2, c3], axis=1)


def seed_uniforms(
    seed: bytes,
    token_ids: npt.ArrayLike,
    arrivals: npt.ArrayLike = 1,
) -> npt.NDArray[np.float64]:
    """U(v, j) at one context for every (v, j) pair (numpy broadcasting of the two arrays).

    Args:
        seed: the context's 32-byte seed.
        token_ids: token IDs v (any shape).
        arrivals: arrival indices j >= 1, broadcast against token_ids.

    Returns:
        float64 array of the broadcast shape, values in (0, 1).
    """
    v, j = np.broadcast_arrays(np.asarray(token_ids, dtype=np.uint32), np.asarray(arrivals, dtype=np.uint32))
    if _fastprf is None:
        return seed_uniforms_reference(seed, v, j)
    out = _fastprf.uniforms(seed, np.ascontiguousarray(v), np.ascontiguousarray(j))
    return np.frombuffer(out, dtype=np.float64).reshape(v.shape)


def seed_uniforms_reference(
    seed: bytes, token_ids: npt.ArrayLike, arrivals: npt.ArrayLike = 1
) -> npt.NDArray[np.float64]:
    """`seed_uniforms` in numpy only: the definition the C path must equal."""
    v, j = np.broadcast_arrays(np.asarray(token_ids, dtype=np.uint64), np.asarray(arrivals, dtype=np.uint64))
    shape = v.shape
    words = np.frombuffer(seed[:16], dtype="<u4").astype(np.uint64)
    n = v.size
    counters = np.empty((n, 4), dtype=np.uint64)
    counters[:, 0] = v.reshape(-1)
    counters[:, 1] = j.reshape(-1)
    counters[:, 2] = words[2]
    counters[:, 3] = words[3]
    keys = np.broadcast_to(words[:2], (n, 2))
    out = philox4x32_10(counters, keys)
    x = (out[:, 1] << np.uint64(20)) | (out[:, 0] >> np.uint64(12))
    return ((x.astype(np.float64) + 0.5) * _TWO_POW_M52).reshape(shape)


class KeyedSource:
    """Seeds of the keyed clocks for one key and spec.

    In window mode a position's label is its h previous token IDs; in prefix mode it is all of
    them. `seed` takes the label itself; the caller decides what the label is.
    """

    def __init__(self, secret: Secret, spec: WatermarkSpec) -> None:
        if spec.is_vllm:
            raise SpecError(f"a {spec.scheme} key is vLLM's own watermark: see wmark.vllm_gumbel")
        self._key = _hmac_key(secret)
        self.spec = spec
        tag = WINDOW_TAG if spec.context_mode == "window" else PREFIX_TAG
        self._prefix = tag + struct.pack(">I", spec.spec_version)

    def __repr__(self) -> str:
        return f"KeyedSource(spec_version={self.spec.spec_version}, secret=<redacted>)"

    def seed(self, label: Sequence[int]) -> bytes:
        """HMAC-SHA256 seed of one context label."""
        return hmac.new(self._key, self._prefix + _be32_words(label), hashlib.sha256).digest()

    def window_pivots(
        self, windows: npt.NDArray[np.uint32], tokens: npt.NDArray[np.uint32], threads: int = 1
    ) -> npt.NDArray[np.float64]:
        """Pivots U(token_i, 1) at each window; see `window_pivots`."""
        return window_pivots(self._key, self._prefix, windows, tokens, threads=threads)

    def scored_pivots(
        self, token_ids: npt.NDArray[np.uint32], start: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
        """Window mode: the scored positions of `token_ids` (`wmark.contexts.scored_positions`)
        and their pivots U(token, 1), in one pass in C; None where the C path is not built."""
        if _fastprf is None:
            return None
        ids = np.ascontiguousarray(token_ids, dtype=np.uint32)
        positions, pivots = _fastprf.scored_pivots(
            self._key, self._prefix, ids, self.spec.context_width, start
        )
        return np.frombuffer(positions, dtype=np.int64), np.frombuffer(pivots, dtype=np.float64)

    def scored_pivots_many(
        self, readings: Sequence[npt.NDArray[np.uint32]], start: int
    ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] | None:
        """`scored_pivots` of each of several token sequences (the readings of one text), each on
        its own, in one C call that hashes a window shared by several of them once; None where
        the C path is not built."""
        if _fastprf is None:
            return None
        ids = [np.ascontiguousarray(x, dtype=np.uint32) for x in readings]
        found = _fastprf.scored_pivots_many(self._key, self._prefix, ids, self.spec.context_width, start)
        return [
            (np.frombuffer(positions, dtype=np.int64), np.frombuffer(pivots, dtype=np.float64))
            for positions, pivots in found
        ]

    def prefix_pivots(self, token_ids: Sequence[int], start: int) -> npt.NDArray[np.float64]:
        """Prefix-mode pivots U(y_t, 1) for t = start..n-1, hashing the label incrementally."""
        ids = list(token_ids)
        mac = hmac.new(self._key, self._prefix + _be32_words(ids[:start]), hashlib.sha256)
        out = np.empty(max(0, len(ids) - start), dtype=np.float64)
        for i, t in enumerate(range(start, len(ids))):
            out[i] = seed_uniforms(mac.copy().digest(), ids[t])
            mac.update(struct.pack(">I", ids[t]))
        return out


class FreeSource:
    """The unkeyed source: seeds from a per-request nonce, indexed by (position, window).

    Used where the key must not be (repeated contexts, the diversity prefix, `pfr-nowm`): still
    shared by drafter and target, still exact, reproducible from the request's seed.
    """

    def __init__(self, nonce: bytes, spec_version: int) -> None:
        if len(nonce) < 16:
            raise ValueError("nonce must be at least 16 bytes")
        self._key = _hmac_key(nonce)
        self._prefix = FREE_TAG + struct.pack(">I", spec_version)

    def __repr__(self) -> str:
        return "FreeSource(nonce=<redacted>)"

    def seed(self, position: int, window: Sequence[int]) -> bytes:
        """HMAC-SHA256 seed of (absolute generated position, window)."""
        return hmac.new(self._key, self._prefix + _be32_words([position, *window]), hashlib.sha256).digest()


def window_pivots(
    key: bytes,
    prefix: bytes,
    windows: npt.NDArray[np.uint32],
    tokens: npt.NDArray[np.uint32],
    *,
    threads: int = 1,
) -> npt.NDArray[np.float64]:
    """U(tokens[i], 1) under the seed HMAC-SHA256(key, prefix || be32(windows[i])), for all i.

    Args:
        key: HMAC key bytes (<= 64 bytes).
        prefix: tag || be32(spec_version).
        windows: (n, h) uint32 context windows.
        tokens: (n,) uint32 token at each position.
        threads: split the batch over this many threads (the C path releases the GIL).

    Returns:
        (n,) float64 pivots.
    """
    windows = np.ascontiguousarray(windows, dtype=np.uint32)
    tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
    n, h = windows.shape
    if _fastprf is None:
        return window_pivots_reference(key, prefix, windows, tokens)
    if threads <= 1 or n < 4096:
        return np.frombuffer(_fastprf.pivots(key, prefix, windows, h, tokens, 1), dtype=np.float64)
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, n, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        parts = pool.map(
            lambda ab: _fastprf.pivots(key, prefix, windows[ab[0] : ab[1]], h, tokens[ab[0] : ab[1]], 1),
            zip(bounds[:-1], bounds[1:], strict=True),
        )
        return np.frombuffer(b"".join(parts), dtype=np.float64)


def window_pivots_reference(
    key: bytes, prefix: bytes, windows: npt.NDArray[np.uint32], tokens: npt.NDArray[np.uint32]
) -> npt.NDArray[np.float64]:
    """`window_pivots` with hashlib and numpy only: the definition the C path must equal."""
    out = np.empty(len(tokens), dtype=np.float64)
    for i in range(len(tokens)):
        seed = hmac.new(key, prefix + _be32_words(windows[i]), hashlib.sha256).digest()
        out[i] = seed_uniforms_reference(seed, int(tokens[i]))
    return out


def first_occurrence(windows: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """True where a row of `windows` (n, h) has not occurred at an earlier row."""
    windows = np.ascontiguousarray(windows, dtype=np.uint32)
    if _fastprf is None:
        return first_occurrence_reference(windows)
    return np.frombuffer(_fastprf.first_occurrence(windows, windows.shape[1]), dtype=np.uint8).astype(bool)


def first_occurrence_reference(windows: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """`first_occurrence` with a Python set: the definition the C path must equal."""
    seen: set[tuple[int, ...]] = set()
    out = np.zeros(len(windows), dtype=bool)
    for i, row in enumerate(windows.tolist()):
        if tuple(row) not in seen:
            seen.add(tuple(row))
            out[i] = True
    return out
