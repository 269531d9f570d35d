"""The machine a benchmark ran on, in one line for its output.

Two VMs that both call their CPU "AMD EPYC" can differ widely in int8 arithmetic: a Zen 4
(x86 family 25) runs 512-bit instructions on 256-bit units, a Zen 5 (family 26) at full width;
two such machines here decoded `basic-uwm` at 16-25 and at 30-33 tokens/s. BENCHMARKS.md only
compares figures within one kind, so every speed script prints this line and a figure says
which machine it came from.
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
