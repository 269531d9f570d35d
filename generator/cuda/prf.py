"""Torch port of the clocks' uniforms U(v, j) (wmark.prf), bit for bit, on CPU or CUDA.

torch has no full uint32 arithmetic, so 32-bit words live in int64 tensors and the 32x32-bit
Philox products are split into 16-bit halves that never overflow int64. Golden vectors in
tests/vectors/ pin this port to the numpy reference.
"""

from __future__ import annotations

import torch

__all__ = ["seed_words", "seed_uniforms_torch"]

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_TWO_POW_M52 = 2.0**-52


def seed_words(seed: bytes, device: torch.device | str = "cpu") -> torch.Tensor:
    """The first four little-endian 32-bit words of a 32-byte seed, as an int64 (4,) tensor."""
    return torch.tensor(
        [int.from_bytes(seed[4 * i : 4 * i + 4], "little") for i in range(4)],
        dtype=torch.int64,
        device=device,
    )


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a < 2^32, m < 2^32: a*m = a*m_hi*2^16 + a*m_lo with both partial products < 2^48.
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p_hi = a * m_hi
    p_lo = a * m_lo
    low = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2^49
    return (p_hi >> 16) + (low >> 32), low & _MASK32


def seed_uniforms_torch(
    words: torch.Tensor, token_ids: torch.Tensor, arrivals: torch.Tensor | int = 1
) -> torch.Tensor:
    """U(v, j) for every broadcast (seed, v, j).

    Args:
        words: (..., 4) int64 seed words (see `seed_words`); broadcast against token_ids.
        token_ids: int64 token IDs v (any shape broadcastable with words[..., 0]).
        arrivals: int64 arrival indices j >= 1 (tensor or int), broadcast likewise.

    Returns:
        float64 tensor of the broadcast shape, values in (0, 1), equal to `wmark.prf.seed_uniforms`.
    """
    v = token_ids.to(torch.int64)
    j = arrivals.to(torch.int64) if isinstance(arrivals, torch.Tensor) else torch.full_like(v, arrivals)
    shape = torch.broadcast_shapes(v.shape, j.shape, words.shape[:-1])  # type: ignore[no-untyped-call]
    c0, c1 = v.expand(shape), j.expand(shape)
    c2, c3 = words[..., 2].expand(shape), words[..., 3].expand(shape)
    k0, k1 = words[..., 0].expand(shape), words[..., 1].expand(shape)
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    x = (c1 << 20) | (c0 >> 12)  # top 52 bits of (c1 << 32 | c0)
    uniforms: torch.Tensor = (x.to(torch.float64) + 0.5) * _TWO_POW_M52
    return uniforms
