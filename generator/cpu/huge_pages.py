"""Ask torch's CPU allocator for transparent huge pages (2 MB) for large tensors.

Loading the embedded pair allocates gigabytes of weights, stacked projections and packings. On
4 KB pages that took 1.19 million page faults, each a trip into the kernel that zeroes a page
(0.67 million with huge pages). With `THP_MEM_ALLOC_ENABLE=1` torch marks allocations of 2 MB
and more `MADV_HUGEPAGE`, so where the kernel's THP mode is `madvise` (the common default) they
fault in 2 MB at a time: on a 2-core EPYC the load took 7.8 s instead of 9.7 s, with 4.8
instead of 7.2 s of system time (bench/load_time.py, medians of three alternating rounds).
Tensors that large are weights and caches, which live for the whole process, so the coarser
pages cost no memory to speak of.

Torch reads the variable once, at its first allocation (during `import torch`), so the CLI
calls `prefer_huge_pages` before any command imports torch, as it does for the OpenMP wait
policy (`wmark.generator.cpu.threads.prefer_passive_wait`).
"""

from __future__ import annotations

import os

__all__ = ["HUGE_PAGES_ENV", "prefer_huge_pages"]

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages() -> None:
    """Let torch use huge pages for tensors of 2 MB and more (unless the user chose); call before
    importing torch."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")
