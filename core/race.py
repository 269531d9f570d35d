"""The exponential race (PFR for discrete distributions) and MPFR, its multi-sample mapping.

Race [docs/algorithms.md §2]: with E_v = -ln U(v, 1) i.i.d. Exp(1), argmin_v E_v / P(v) ~ P exactly.
MPFR [§4.1]: token v's clock has arrivals A_{v,j} = sum_{i<=j} E_{v,i}; the labels of the n
smallest A_{v,j} / R(v) are n i.i.d. draws from R (mapping theorem). Its first draw is the race
winner, because A_{v,1} = E_{v,1}. Both operate on a support (the tokens with R > 0) given
with their uniforms, so callers pass only the top-k slice.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["mpfr_draws", "race_winner"]


def race_winner(probs: npt.NDArray[np.floating], uniforms: npt.NDArray[np.float64]) -> int:
    """Index of the race winner argmin_v -ln(U_v) / P(v); tokens with P(v) = 0 never win.

    Args:
        probs: (k,) probabilities of the support (any float dtype, >= 0, not all 0).
        uniforms: (k,) U(v, 1) of the same tokens.
    """
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore"):
        times = np.where(p > 0, -np.log(uniforms) / p, np.inf)
    return int(np.argmin(times))


def mpfr_draws(probs: npt.NDArray[np.floating], uniforms: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The n MPFR draws from R, in order of arrival (labels may repeat).

    Args:
        probs: (k,) probabilities R of the support.
        uniforms: (k, n) U(v, j) for arrivals j = 1..n (column j-1).

    Returns:
        (n,) support indices of the n earliest scaled arrivals, earliest first.
    """
    p = np.asarray(probs, dtype=np.float64)
    arrivals = np.cumsum(-np.log(uniforms), axis=1)  # A_{v,j}
    with np.errstate(divide="ignore"):
        times = np.where(p[:, None] > 0, arrivals / p[:, None], np.inf)
    n = uniforms.shape[1]
    flat = np.argsort(times, axis=None, kind="stable")[:n]
    draws: npt.NDArray[np.int64] = (flat // n).astype(np.int64)
    return draws
