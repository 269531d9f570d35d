"""Type stub of the C extension (see _int8_gemm.c)."""

from typing import Any

Buffer = Any  # a C-contiguous buffer: a numpy array or a CPU tensor's .numpy() view

def packed_size(n: int, k: int, /) -> int: ...
def pack(weight: Buffer, packed: Buffer, colsum: Buffer, n: int, k: int, /) -> None: ...
def pack4(packed: Buffer, packed4: Buffer, colsum4: Buffer, step: Buffer, n: int, k: int, /) -> None: ...
def unpack(packed: Buffer, weight: Buffer, n: int, k: int, /) -> None: ...
def linear(
    x: Buffer,
    packed: Buffer,
    colsum: Buffer,
    scale: Buffer,
    bias: Buffer | None,
    out: Buffer,
    m: int,
    n: int,
    k: int,
    threads: int,
    /,
) -> None: ...
def linear4(
    x: Buffer,
    packed: Buffer,
    colsum: Buffer,
    scale: Buffer,
    bias: Buffer | None,
    out: Buffer,
    m: int,
    n: int,
    k: int,
    threads: int,
    /,
) -> None: ...
def backend() -> str: ...
def backends() -> list[str]: ...
def use_backend(name: str, /) -> None: ...
def prefetch(policy: str = ..., /) -> str: ...
