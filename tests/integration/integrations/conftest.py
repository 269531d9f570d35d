"""vLLM tests run in vLLM's own venv (`make test-vllm`); the main suite's venv has no vLLM."""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("vllm") else ["test_vllm_engine.py"]
