"""Sampler names, importable without torch (for CLI help and argument checks)."""

from __future__ import annotations

__all__ = ["METHOD_NAMES"]

METHOD_NAMES: tuple[str, ...] = (
    "basic-uwm",
    "pfr",
    "pfr-nowm",
    "mpfr",
    "vsps",
    "mws",
    "mse",
    "mse-pseudo",
    "gls",
)
