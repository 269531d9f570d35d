"""Keyed randomness: Philox KATs, HMAC oracle, golden vectors for the numpy and torch ports,
the C fast path against the reference, prefix consistency."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import numpy as np
import pytest

from wmark import Secret
from wmark import prf as prf_mod
from wmark.prf import (
    FreeSource,
    KeyedSource,
    first_occurrence,
    first_occurrence_reference,
    philox4x32_10,
    seed_uniforms,
    seed_uniforms_reference,
    window_pivots,
    window_pivots_reference,
)

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "prf_v1.json").read_text())

# Random123 tests/kat_vectors, the three philox4x32-10 lines: counter, key -> output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT, ids=["zeros", "ones", "pi"])
def test_philox_matches_random123_known_answers(counter, key, expected):
    out = philox4x32_10(np.array([counter], dtype=np.uint64), np.array([key], dtype=np.uint64))
    assert tuple(int(x) for x in out[0]) == expected


@pytest.mark.parametrize("case", range(len(VECTORS["keyed_window"])))
def test_numpy_port_reproduces_golden_vectors(case, word_spec):
    vec = VECTORS["keyed_window"][case]
    source = KeyedSource(Secret(bytes.fromhex(vec["secret"])), word_spec)
    seed = source.seed(vec["window"])
    assert seed.hex() == vec["seed"]
    grid_v, grid_j = np.meshgrid(vec["tokens"], vec["arrivals"], indexing="ij")
    for impl in (seed_uniforms, seed_uniforms_reference):  # the C path and the numpy definition
        u = impl(seed, grid_v, grid_j)
        assert [[float(x).hex() for x in row] for row in u] == vec["uniforms"]


def test_torch_port_reproduces_golden_vectors_bit_for_bit():
    import torch

    from wmark.generator.cuda.prf import seed_uniforms_torch, seed_words

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for vec in VECTORS["keyed_window"]:
            words = seed_words(bytes.fromhex(vec["seed"]), device)
            v = torch.tensor(vec["tokens"], dtype=torch.int64, device=device)[:, None]
            j = torch.tensor(vec["arrivals"], dtype=torch.int64, device=device)[None, :]
            u = seed_uniforms_torch(words, v, j).cpu().numpy()
            assert [[float(x).hex() for x in row] for row in u] == vec["uniforms"], device


def test_free_source_reproduces_golden_vectors():
    free = VECTORS["free"]
    source = FreeSource(bytes.fromhex(free["nonce"]), free["spec_version"])
    for case in free["seeds"]:
        assert source.seed(case["position"], case["window"]).hex() == case["seed"]


def test_seed_is_hmac_sha256_of_the_documented_message(word_spec):
    secret = os.urandom(32)
    window = [7, 8, 9, 10]
    expected = hmac.new(
        secret,
        b"wmark.ctx" + (1).to_bytes(4, "big") + b"".join(w.to_bytes(4, "big") for w in window),
        hashlib.sha256,
    ).digest()
    assert KeyedSource(Secret(secret), word_spec).seed(window) == expected


def test_one_changed_byte_of_prf_input_changes_every_output(word_spec):
    vec = VECTORS["keyed_window"][1]
    secret = bytearray.fromhex(vec["secret"])
    secret[-1] ^= 1
    changed_key = KeyedSource(Secret(bytes(secret)), word_spec).seed(vec["window"])
    window = list(vec["window"])
    window[-1] ^= 1
    changed_window = KeyedSource(Secret(bytes.fromhex(vec["secret"])), word_spec).seed(window)
    grid_v, grid_j = np.meshgrid(vec["tokens"], vec["arrivals"], indexing="ij")
    golden = np.array([[float.fromhex(x) for x in row] for row in vec["uniforms"]])
    for seed in (changed_key, changed_window):
        assert seed.hex() != vec["seed"]
        assert not np.any(seed_uniforms(seed, grid_v, grid_j) == golden)


def test_uniforms_are_prefix_consistent():
    seed = hashlib.sha256(b"ctx").digest()
    full = seed_uniforms(seed, np.arange(1000)[:, None], np.arange(1, 9)[None, :])
    # Any slice of tokens, any number of arrivals, any order: the same numbers.
    assert np.array_equal(seed_uniforms(seed, np.arange(100, 200), 1), full[100:200, 0])
    assert np.array_equal(seed_uniforms(seed, [999, 3], [[1], [5]]), full[[999, 3]][:, [0, 4]].T)
    assert np.array_equal(seed_uniforms(seed, 42, 8), full[42, 7])


def test_uniforms_lie_strictly_inside_the_unit_interval_and_look_uniform():
    seed = hashlib.sha256(b"uniform").digest()
    u = seed_uniforms(seed, np.arange(200_000))
    assert u.min() > 0.0 and u.max() < 1.0
    # Mean of 2e5 uniforms has sd sqrt(1/12/2e5) = 6.5e-4; 5 sd = 3.2e-3.
    assert abs(u.mean() - 0.5) < 3.2e-3
    # Decile counts: each ~ Binomial(2e5, 0.1), sd = 134; 5 sd = 671.
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - 20_000) < 671)


@pytest.mark.parametrize("portable", [False, True], ids=["sha-ni-if-present", "portable-c"])
def test_c_fast_path_equals_reference(portable):
    fast = prf_mod._fastprf
    if fast is None:
        pytest.fail("the C extension wmark._fastprf was not built")
    rng = np.random.default_rng(0)
    fast.use_portable(portable)
    try:
        for key_len in (16, 32, 64):
            for h in (1, 4, 9, 16):  # 9 and 16 push the message past one SHA-256 block
                key = rng.bytes(key_len)
                prefix = b"wmark.ctx" + (1).to_bytes(4, "big")
                windows = rng.integers(0, 2**32, size=(257, h), dtype=np.uint32)
                tokens = rng.integers(0, 2**32, size=257, dtype=np.uint32)
                assert np.array_equal(
                    window_pivots(key, prefix, windows, tokens),
                    window_pivots_reference(key, prefix, windows, tokens),
                )
                seeds = fast.context_seeds(key, prefix, windows, h)
                for i in (0, 100, 256):
                    expected = hmac.new(
                        key, prefix + windows[i].astype(">u4").tobytes(), hashlib.sha256
                    ).digest()
                    assert seeds[32 * i : 32 * i + 32] == expected
    finally:
        fast.use_portable(False)


def test_threaded_pivots_equal_single_threaded():
    rng = np.random.default_rng(1)
    windows = rng.integers(0, 150_000, size=(20_000, 4), dtype=np.uint32)
    tokens = rng.integers(0, 150_000, size=20_000, dtype=np.uint32)
    key, prefix = b"k" * 32, b"wmark.ctx\x00\x00\x00\x01"
    assert np.array_equal(
        window_pivots(key, prefix, windows, tokens, threads=2),
        window_pivots(key, prefix, windows, tokens, threads=1),
    )


def test_first_occurrence_fast_equals_reference():
    rng = np.random.default_rng(2)
    for h in (1, 2, 4):
        windows = rng.integers(0, 4, size=(5000, h), dtype=np.uint32)  # many repeats
        assert np.array_equal(first_occurrence(windows), first_occurrence_reference(windows))
    assert first_occurrence(np.empty((0, 4), dtype=np.uint32)).shape == (0,)


@pytest.mark.parametrize("portable", [False, True], ids=["sha-ni-if-present", "portable-c"])
def test_scored_pivots_in_one_pass_equal_positions_then_pivots(portable):
    """`KeyedSource.scored_pivots` (C, one pass) is `scored_positions` then `window_pivots`."""
    from wmark import TokenizerRef, WatermarkSpec
    from wmark.contexts import scored_positions

    fast = prf_mod._fastprf
    if fast is None:
        pytest.fail("the C extension wmark._fastprf was not built")
    rng = np.random.default_rng(3)
    fast.use_portable(portable)
    try:
        for h in (1, 2, 4, 9):
            ref = TokenizerRef(name="t", sha256="0" * 64, vocab_size=2**32)
            source = KeyedSource(Secret(rng.bytes(32)), WatermarkSpec(tokenizer=ref, context_width=h))
            for n in (0, 1, h, h + 1, 50, 700):
                for alphabet in (3, 2**32):  # many repeated windows, and none
                    ids = rng.integers(0, alphabet, size=n, dtype=np.uint64).astype(np.uint32)
                    for start in (0, 3, h + 7, n + 2):
                        sp = scored_positions(ids, h, start)
                        want = window_pivots_reference(
                            source._key, source._prefix, sp.windows, ids[sp.positions]
                        )
                        found = source.scored_pivots(ids, start)
                        assert found is not None
                        assert np.array_equal(found[0], sp.positions)
                        assert np.array_equal(found[1], want)
    finally:
        fast.use_portable(False)


@pytest.mark.parametrize("portable", [False, True], ids=["sha-ni-if-present", "portable-c"])
def test_scored_pivots_of_several_readings_equal_each_alone(portable):
    """`KeyedSource.scored_pivots_many` (one C call; a window shared by readings hashed once, two
    HMACs at a time) is `scored_pivots` of each reading: near-copies, repeats and odd counts."""
    from wmark import TokenizerRef, WatermarkSpec
    from wmark.contexts import scored_positions

    fast = prf_mod._fastprf
    if fast is None:
        pytest.fail("the C extension wmark._fastprf was not built")
    rng = np.random.default_rng(4)
    fast.use_portable(portable)
    try:
        for h in (1, 2, 4, 9, 11):  # 11: past one SHA-256 block
            ref = TokenizerRef(name="t", sha256="0" * 64, vocab_size=2**32)
            source = KeyedSource(Secret(rng.bytes(32)), WatermarkSpec(tokenizer=ref, context_width=h))
            for trial in range(12):
                alphabet = 4 if trial % 3 == 0 else 2**32
                base = rng.integers(0, alphabet, size=int(rng.integers(0, 300)), dtype=np.uint64)
                readings = [base.astype(np.uint32)]
                for _ in range(trial % 4):  # near-copies: a few IDs changed, a few inserted
                    x = readings[0].copy()
                    if len(x):
                        x[rng.integers(0, len(x), size=3)] = rng.integers(0, 5, size=3)
                    cut = int(rng.integers(0, len(x) + 1))
                    extra = rng.integers(0, 5, size=int(rng.integers(0, 6))).astype(np.uint32)
                    readings.append(np.concatenate([x[:cut], extra, x[cut:]]))
                for start in (0, 5, 400):
                    found = source.scored_pivots_many(readings, start)
                    assert found is not None and len(found) == len(readings)
                    for ids, (positions, pivots) in zip(readings, found, strict=True):
                        sp = scored_positions(ids, h, start)
                        want = window_pivots_reference(
                            source._key, source._prefix, sp.windows, ids[sp.positions]
                        )
                        assert np.array_equal(positions, sp.positions)
                        assert np.array_equal(pivots, want)
            assert source.scored_pivots_many([], 0) == []
    finally:
        fast.use_portable(False)


def test_secret_never_shows_in_repr():
    raw = bytes(range(32))
    secret = Secret(raw)
    for text in (repr(secret), str(secret), repr(KeyedSource(secret, _spec())), repr(FreeSource(raw, 1))):
        assert raw.hex() not in text and "redacted" in text


def _spec():
    from wmark import TokenizerRef, WatermarkSpec

    return WatermarkSpec(tokenizer=TokenizerRef(name="t", sha256="0" * 64, vocab_size=10))
