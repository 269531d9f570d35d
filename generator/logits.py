"""Logits processing: temperature, top-k, top-p -> the distribution a sampler draws from.

The same processing runs on target and drafter (each with its own temperature). The result
is the *support* (the tokens with non-zero probability) and their probabilities in float64,
so samplers only ever touch the k tokens that can win.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from wmark.errors import InputError

__all__ = ["LogitsConfig", "Support", "supports"]


@dataclass(frozen=True, kw_only=True)
class LogitsConfig:
    """How logits become a sampling distribution.

    Attributes:
        temperature: > 0; logits are divided by it.
        top_k: keep the k largest logits (0 = keep all).
        top_p: keep the smallest set of top tokens whose probability reaches top_p (1.0 = off).
    """

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise InputError("temperature must be > 0: a watermark needs sampling (greedy text carries none)")
        if self.top_k < 0:
            raise InputError("top_k must be >= 0 (0 disables it)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError("top_p must be in (0, 1]")


@dataclass(frozen=True)
class Support:
    """A processed distribution restricted to its support.

    Attributes:
        ids: (k,) int64 token IDs, most probable first.
        probs: (k,) float64 probabilities (sum to 1).
    """

    ids: npt.NDArray[np.int64]
    probs: npt.NDArray[np.float64]

    def prob_of(self, token: int) -> float:
        """Probability of `token` (0 outside the support)."""
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0


def _top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest entries, larger first: wmark's one-pass C scan on the CPU (ties by
    smaller token ID; faster than torch.topk over a 152k vocabulary: BENCHMARKS.md, "Kernels"),
    torch.topk elsewhere."""
    if x.device.type != "cpu" or k == x.shape[-1]:
        values, ids = torch.topk(x, k, dim=-1, sorted=True)
        return values, ids
    from wmark.generator.cpu import _topk  # the CPU path's kernel: a CUDA run needs no C extension

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    values = torch.empty(rows.shape[0], k)
    ids = torch.empty(rows.shape[0], k, dtype=torch.int64)
    _topk.top_k(rows.numpy(), values.numpy(), ids.numpy(), rows.shape[0], rows.shape[1], k)
    return values, ids


def supports(logits: torch.Tensor, config: LogitsConfig) -> list[Support]:
    """Process each row of `logits` into a `Support`.

    Args:
        logits: (n, V) float tensor, one row per context.
        config: the processing.

    Returns:
        n supports, in row order (an all -inf row gives an empty support).
    """
    x = logits.detach().to(torch.float32)
    vocab = x.shape[-1]
    k = config.top_k if 0 < config.top_k < vocab else vocab
    values, ids = _top_k(x, k)
    scaled = values.to(torch.float64).cpu() / config.temperature
    probs = torch.softmax(scaled, dim=-1).numpy()
    ids_np = ids.cpu().numpy().astype(np.int64)
    out = []
    for row_ids, row_p in zip(ids_np, probs, strict=True):
        if not np.isfinite(row_p).all():  # an all -inf row: a drafter with nothing to propose
            out.append(Support(row_ids[:0], row_p[:0]))
            continue
        if config.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(row_p), config.top_p) + 1)
            row_ids, row_p = row_ids[:keep], row_p[:keep] / row_p[:keep].sum()
        nonzero = row_p > 0
        out.append(Support(row_ids[nonzero], row_p[nonzero]))
    return out
