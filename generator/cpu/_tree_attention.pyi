"""Type stub of the C extension (see _tree_attention.c)."""

from typing import Any

Buffer = Any  # a C-contiguous buffer: a numpy array or a CPU tensor's .numpy() view

def attend(
    q: Buffer,
    k: Buffer,
    v: Buffer,
    visible: Buffer,
    out: Buffer,
    heads: int,
    kv_heads: int,
    nq: int,
    nkv: int,
    dim: int,
    scaling: float,
    kv_stride: int = ...,
    threads: int = ...,
    /,
) -> None: ...
def rotate(
    qkv: Buffer,
    cos: Buffer,
    sin: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    heads: int,
    kv_heads: int,
    n: int,
    dim: int,
    /,
) -> None: ...
def backend() -> str: ...
def pooled() -> bool: ...
