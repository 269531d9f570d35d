"""Ask torch's CPU allocator for transparent huge pages (2 MB) for large tensors.

Loading the embedded pair allocates about 3 GB of weights and packings. On 4 KB pages that is
some 750,000 page faults, each one a trip into the kernel that zeroes a page: loading spent
8.4 s of system time next to 12 s of user time, and the load took 10.6 s on a 2-core EPYC. With
`THP_MEM_ALLOC_ENABLE=1` torch aligns allocations of 2 MB and more to 2 MB and marks them
`MADV_HUGEPAGE`, so where the kernel's THP mode is `madvise` (the common default) they fault in
2 MB at a time: the same load took 8.5 s with 5.6 s of system time. Tensors that large are
weights and caches, which live for the whole process, so the coarser pages cost no memory to
speak of.

Torch reads the variable once, at its first allocation (during `import torch`), so the CLI
calls `prefer_huge_pages` before any command imports torch, as it does for the OpenMP wait
policy (`wmark.generator.cpu_threads.prefer_passive_wait`).
"""

from __future__ import annotations

import os

__all__ = ["HUGE_PAGES_ENV", "prefer_huge_pages"]

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages() -> None:
    """Let torch use huge pages for tensors of 2 MB and more (unless the user chose); call before
    importing torch."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")
