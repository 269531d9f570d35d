"""The CLI's huge-page request reaches torch's allocator (it is read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wmark.generator import settings

# Four 8 MB tensors: with the request torch marks each one MADV_HUGEPAGE, which the kernel shows
# as the "hg" flag of the memory area holding it (/proc/self/smaps); nothing else sets that flag.
_PROBE = """
import sys
from wmark.generator.settings import prefer_huge_pages
if sys.argv[1] == "ask":
    prefer_huge_pages()
import torch
tensors = [torch.empty(2 << 20) for _ in range(4)]
areas, flagged = [], set()
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and ":" not in head:
        start, stop = (int(x, 16) for x in head.split("-"))
        areas.append((start, stop))
    elif head == "VmFlags:" and "hg" in line.split()[1:]:
        flagged.add(areas[-1])
print(sum(any(a <= t.data_ptr() < b for a, b in flagged) for t in tensors))
"""


def _advised(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != settings.HUGE_PAGES_ENV}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_large_tensors_are_advised_huge_pages_only_when_asked():
    assert _advised("ask") == 4
    assert _advised("none") == 0


def test_a_choice_already_made_is_kept(monkeypatch):
    monkeypatch.delenv(settings.HUGE_PAGES_ENV, raising=False)
    settings.prefer_huge_pages()
    assert os.environ[settings.HUGE_PAGES_ENV] == "1"
    monkeypatch.setenv(settings.HUGE_PAGES_ENV, "0")
    settings.prefer_huge_pages()
    assert os.environ[settings.HUGE_PAGES_ENV] == "0"
