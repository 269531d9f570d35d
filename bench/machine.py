"""The machine a benchmark ran on, in one line for its output.

Two CPUs with the same model name can differ by 2x in int8 arithmetic: "AMD EPYC" in a VM is
Zen 4 (family 25, 512-bit VNNI at half rate) or Zen 5 (family 26, full rate), and the tables
in BENCHMARKS.md only compare within one kind. Every speed script prints this line so that a
figure says which it came from.
"""

from __future__ import annotations

import os
from pathlib import Path

from wmark.generator.cpu import _int8_gemm


def describe() -> str:
    """E.g. 'AMD EPYC (x86 family 25 model 17), 2 CPUs, int8 GEMM build avx512vnni (no AMX)'."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    name = fields.get("model name", "unknown CPU")
    family = f"x86 family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    flags = set(fields.get("flags", "").split())
    amx = "AMX" if "amx_int8" in flags else "no AMX"
    return f"{name} ({family}), {cpus} CPUs, int8 GEMM build {_int8_gemm.backend()} ({amx})"
