"""Type stub of the C extension (see _int8_gemm.h; its methods are in _int8_gemm_module.c)."""

from collections.abc import Sequence
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
    prologue: int = ...,
    norm: Buffer | None = ...,
    eps: float = ...,
    activations: int = ...,  # 0 one part, 1 two, 2 outliers (`rowwise.ACTIVATIONS`)
    scale_cols: int = ...,  # 0 a scale per channel, else per channel and block of this many columns
    /,
) -> None: ...

linear4 = linear  # the same arguments over 4-bit weights
_pool_api: object  # capsule: the worker pool for the other extensions (_pool_api.h)

def backend() -> str: ...
def backends() -> list[str]: ...
def use_backend(name: str, /) -> None: ...
def prefetch(policy: str = ..., /) -> str: ...
def wait_policy(policy: str = ..., /) -> str: ...
def worker_cpus(cpus: Sequence[int] | None, /) -> None: ...
