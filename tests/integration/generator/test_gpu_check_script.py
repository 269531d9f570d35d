"""bench/gpu_check.py runs end to end on CPU with tiny models (the GPU run uses the same code paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"

# The GPU machine has torch, transformers, numpy and scipy and nothing else: the script runs
# here with the service's packages made unimportable, so an import of one of them on its path
# fails this test rather than the GPU run.
NOT_ON_THE_DEVICE = (
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "cryptography",
    "psycopg",
    "alembic",
    "dask",
    "redis",
)
RUN_WITHOUT_THEM = (
    "import runpy, sys\n"
    f"for name in {NOT_ON_THE_DEVICE!r}:\n"
    "    sys.modules[name] = None  # `import name` raises ImportError\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_gpu_check_passes_on_cpu_with_tiny_models():
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_WITHOUT_THEM,
            str(SCRIPT),
            "--device",
            "cpu",
            "--small",
            "--reps",
            "1",
            "--tokens",
            "24",
        ],
        capture_output=True,
        text=True,
        timeout=300,  # ~10 s of work; the bound only keeps a hung run from stalling the suite
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "PRF: torch on cpu vs numpy reference, 4 x 4096 x 3 uniforms: identical" in out
    # on both paths (the slab cache, the static one): tree attention agrees with the CPU
    # reference, exact-fp32 is batch invariant, r(B, L) and the predicted speedup reach B = 8
    assert out.count(": ok") == 2
    assert out.count("drafter invariance: 6/6 answers identical to basic-uwm") == 2
    assert out.count("\n| 8 | ") == 6  # and the paper's shapes (tiny stand-ins here)
    assert "[paper's shapes: tiny stand-ins]" in out
    assert "\n  slab: " in out and "\n  static: " in out  # the step and end-to-end rows
    # the committed CPU counts (bench/forward_counts.json) priced with this run's cost tables
    assert "| summaries-mini | default |" in out and "| code-mini | basic-uwm | 1.00 | 1.00x |" in out
    assert "FAILED" not in out and "all checks passed" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_check_refuses_cuda_without_a_device():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert done.returncode == 2 and "no CUDA device" in done.stderr


def test_the_tree_check_fails_on_other_weights():
    """The tree check compares the device's model with the CPU reference built from the same
    weights; a model with other weights (what the script compared before it copied them) must
    fail it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    vocab, eos = gpu_check.SMALL_COMMON["vocab_size"], frozenset({gpu_check.EOS})

    def check(reference_seed: int, device_seed: int) -> bool:
        def model(seed: int):
            raw = gpu_check.build("target", True, seed=seed)
            return raw, gpu_check.HFModel(gpu_check.prepare_model(raw, "fp32", "cpu"), eos)

        raw, device_model = model(device_seed)
        return bool(gpu_check.check_tree(raw, model(reference_seed)[1], device_model, vocab))

    assert check(0, 0)
    assert not check(0, 5)
