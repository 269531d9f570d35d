"""Fixtures of the generator's kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from wmark.generator.cpu import _int8_gemm

BACKENDS = _int8_gemm.backends()  # this CPU's builds, fastest first; "portable" runs everywhere


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each int8 GEMM build this CPU runs in turn (the fastest put back after)."""
    _int8_gemm.use_backend(request.param)
    yield request.param
    _int8_gemm.use_backend(BACKENDS[0])
