"""Type stub of the C extension (see _fastsplice.c)."""

from typing import Any

Buffer = Any  # bytes, bytearray, memoryview or a C-contiguous numpy array

def changed_chunks(flags: Buffer, ids: Buffer, ends: Buffer, /) -> bytes: ...
def changed_spans(flags: Buffer, byte_len: Buffer, ids: Buffer, ends: Buffer, /) -> tuple[bytes, bytes]: ...
