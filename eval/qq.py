"""A QQ plot of p-values against Unif(0, 1), as a CSV table or an SVG figure (no plotting library).

The i-th smallest of n p-values is plotted against its expected position (i - 0.5) / n, on
-log10 scales, where the small p-values (the ones that make false positives) are visible. Under
H0 the i-th smallest of n uniforms is Beta(i, n - i + 1): its central interval at `confidence`
is the band drawn around the diagonal (pointwise, not simultaneous). Points under the band's
lower edge on the right of the figure are p-values too small; points above it are conservative.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import stats

from wmark.errors import InputError

__all__ = ["QQ_SUFFIXES", "qq_points", "write_qq"]

QQ_SUFFIXES = (".csv", ".svg")
_MAX_POINTS = 2000  # an SVG with more is slow to draw and shows nothing more
_FLOOR = 1e-300  # p-values are plotted on -log10 scales: 0 (underflow) is drawn at this floor


def qq_points(
    p_values: Sequence[float] | npt.NDArray[np.float64], *, confidence: float = 0.99
) -> tuple[
    npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]
]:
    """(expected, observed, band_low, band_high): sorted p-values, their expected positions and
    the pointwise interval of the i-th smallest of n uniforms."""
    observed = np.sort(np.asarray(p_values, dtype=np.float64))
    n = len(observed)
    i = np.arange(1, n + 1, dtype=np.float64)
    expected = (i - 0.5) / n
    tail = (1.0 - confidence) / 2.0
    return expected, observed, stats.beta.ppf(tail, i, n - i + 1), stats.beta.ppf(1.0 - tail, i, n - i + 1)


def write_qq(
    path: Path, p_values: Sequence[float] | npt.NDArray[np.float64], *, title: str, confidence: float
) -> None:
    """Write the QQ plot of `p_values` to `path`: a .csv table or an .svg figure.

    Raises:
        InputError: another suffix, no p-values, or a file that cannot be written.
    """
    suffix = path.suffix.lower()
    if suffix not in QQ_SUFFIXES:
        raise InputError(f"--qq {path}: write a .csv table or an .svg figure")
    if len(p_values) == 0:
        raise InputError(f"--qq {path}: no document was scored, there is nothing to plot")
    points = qq_points(p_values, confidence=confidence)
    try:
        if suffix == ".csv":
            _write_csv(path, *points)
        else:
            path.write_text(_svg(*points, title=title, confidence=confidence), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--qq {path}: cannot write ({exc.strerror or exc})") from None


def _write_csv(path: Path, *columns: npt.NDArray[np.float64]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["rank", "expected", "observed", "band_low", "band_high"])
        for rank, row in enumerate(zip(*(c.tolist() for c in columns), strict=True), start=1):
            writer.writerow([rank, *(f"{v:.6g}" for v in row)])


def _thin(n: int) -> npt.NDArray[np.int64]:
    """Indices to draw: all of the smallest p-values, evenly spaced ones above them."""
    if n <= _MAX_POINTS:
        return np.arange(n)
    head = np.arange(_MAX_POINTS // 2)
    rest = np.linspace(_MAX_POINTS // 2, n - 1, _MAX_POINTS // 2).astype(np.int64)
    return np.unique(np.concatenate([head, rest]))


def _svg(
    expected: npt.NDArray[np.float64],
    observed: npt.NDArray[np.float64],
    low: npt.NDArray[np.float64],
    high: npt.NDArray[np.float64],
    *,
    title: str,
    confidence: float,
) -> str:
    keep = _thin(len(expected))
    x, y = -np.log10(expected[keep]), -np.log10(np.maximum(observed[keep], _FLOOR))
    band_low, band_high = -np.log10(high[keep]), -np.log10(np.maximum(low[keep], _FLOOR))
    top = math.ceil(max(float(x.max()), float(np.minimum(y, 20.0).max()), 1.0))
    width, height, margin = 480, 480, 56
    side = width - 2 * margin

    def px(v: float) -> float:
        return margin + min(v, top) / top * side

    def py(v: float) -> float:
        return height - margin - min(v, top) / top * side

    band = [f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x.tolist(), band_high.tolist(), strict=True)]
    band += [
        f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x[::-1].tolist(), band_low[::-1].tolist(), strict=True)
    ]
    dots = "".join(
        f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="1.8"/>'
        for a, b in zip(x.tolist(), y.tolist(), strict=True)
    )
    ticks = "".join(
        f'<text x="{px(t):.1f}" y="{height - margin + 16}" text-anchor="middle">{t}</text>'
        f'<text x="{margin - 8}" y="{py(t) + 4:.1f}" text-anchor="end">{t}</text>'
        for t in range(top + 1)
    )
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">'
        f'<rect width="{width}" height="{height}" fill="white"/>'
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="13">{safe_title}</text>'
        f'<polygon points="{" ".join(band)}" fill="#cfe0f3"/>'
        f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(top)}" y2="{py(top)}" '
        'stroke="#555" stroke-dasharray="4 3"/>'
        f'<rect x="{margin}" y="{margin}" width="{side}" height="{side}" fill="none" stroke="#333"/>'
        f'<g fill="#1f4e9c">{dots}</g>{ticks}'
        f'<text x="{width / 2}" y="{height - 16}" text-anchor="middle">-log10 expected p (uniform)</text>'
        f'<text x="16" y="{height / 2}" text-anchor="middle" transform="rotate(-90 16 {height / 2})">'
        f"-log10 observed p</text>"
        f'<text x="{width - margin}" y="{margin - 8}" text-anchor="end">band: {confidence:.0%} pointwise, '
        f"{len(expected):,} p-values</text></svg>\n"
    )
