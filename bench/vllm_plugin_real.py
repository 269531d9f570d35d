"""vLLM serving a real model with wmark's logits processor: is every answer detected at 128 tokens?

    make vllm-venv
    ~/.cache/wmark/vllm-venv-0.32.0-torch2.13.0/bin/python bench/vllm_plugin_real.py [--model DIR]

The model defaults to the embedded drafter (Qwen2.5-Coder-0.5B-Instruct) as converted in wmark's
model cache by `wmark generate`/`wmark demo` (a real instruction-tuned model small enough for
vLLM on this CPU). A fresh key bound to its tokenizer is made in a temporary registry; the
prompts are wmark eval's built-in sets, through the model's chat template; every answer is 128
tokens (`min_tokens`, so EOS is masked before the race sees the distribution) at temperature 1,
top-k 50; each is detected with `wmark.detector.Detector`.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

from wmark.detector import Detector  # noqa: E402
from wmark.detector.tokenize import read_tokenizer_source  # noqa: E402
from wmark.eval.prompts import Prompt, load_prompt_set  # noqa: E402
from wmark.generator.models.embedded import DRAFTER, models_dir  # noqa: E402
from wmark.integrations.vllm import WmarkLogitsProcessor  # noqa: E402
from wmark.keys import KeyRegistry, RegistryConfig  # noqa: E402

N_TOKENS = 128


def _prompts(per_set: int) -> list[Prompt]:
    return [
        p
        for name in ("code-mini", "eli5-mini", "summaries-mini")
        for p in load_prompt_set(name, limit=per_set).prompts
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(models_dir() / DRAFTER.sha256))
    parser.add_argument("--per-set", type=int, default=4)
    args = parser.parse_args()

    os.environ["WMARK_HOME"] = tempfile.mkdtemp(prefix="wmark-vllm-bench-")
    data, name = read_tokenizer_source(args.model)
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key_id = registry.create_key("vllm-bench", registry.add_tokenizer(data, name)).key_id
        key = registry.material(key_id)
    os.environ["WMARK_VLLM_KEY_ID"] = key_id

    start = time.perf_counter()
    llm = LLM(model=args.model, logits_processors=[WmarkLogitsProcessor], dtype="float32", max_model_len=1024)
    loaded = time.perf_counter() - start
    prompts = _prompts(args.per_set)
    params = SamplingParams(temperature=1.0, top_k=50, min_tokens=N_TOKENS, max_tokens=N_TOKENS)
    start = time.perf_counter()
    outputs = llm.chat([p.chat_messages() for p in prompts], params)
    generated = time.perf_counter() - start

    detector = Detector([key])
    log_ps = []
    print(f"model {args.model}; loaded in {loaded:.0f} s; {len(prompts)} prompts in {generated:.0f} s")
    print()
    print("| prompt | tokens | scored | p-value |")
    print("|---|---:|---:|---:|")
    for prompt, out in zip(prompts, outputs, strict=True):
        ids = list(out.outputs[0].token_ids)
        d = detector.detect(token_ids=ids)
        log_ps.append(d.log_p)
        print(f"| {prompt.id} | {len(ids)} | {d.n_scored} | {d.p_value:.1e} |")
    passed = sum(lp < math.log(1e-6) for lp in log_ps)
    print()
    print(
        f"p < 1e-6: {passed}/{len(log_ps)}; median p-value {math.exp(statistics.median(log_ps)):.1e}; "
        f"largest {math.exp(max(log_ps)):.1e}"
    )


if __name__ == "__main__":
    main()
