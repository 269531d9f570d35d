"""Type stub of the C extension (see _topk.c)."""

from typing import Any

Buffer = Any  # a C-contiguous buffer: a numpy array or a CPU tensor's .numpy() view

def top_k(logits: Buffer, values: Buffer, ids: Buffer, rows: int, vocab: int, k: int, /) -> None: ...
def use_portable(flag: bool, /) -> None: ...
