"""GPU readiness: wmark's generator on random-weight models with the embedded pair's shapes.

    python bench/gpu_check.py                          # CUDA: Qwen2.5 1.5B / 0.5B shapes, bf16
    python bench/gpu_check.py --device cpu --small     # the same checks on tiny models (tests run it)

Needs torch, transformers, numpy and scipy, and wmark's C extensions (the CPU reference runs
through wmark's prepared models), built in one line from a source checkout with no other package:

    pip install --no-deps --no-build-isolation --target /tmp/wmark .
    PYTHONPATH=/tmp/wmark python bench/gpu_check.py

The device's models and the CPU reference are copies of the same float32 weights, built once on
the CPU, so every comparison below can fail. No weights are downloaded: the models are random (their output
layer sharpened so that their entropy is like a language model's), which is all a check of the
arithmetic and a measurement of forward costs need. It reports:

1. PRF: the torch port of the clocks' uniforms on the device against the numpy reference
   (bit for bit).
2. Tree attention: one forward over a draft tree (B branches of L tokens) against each branch
   decoded as a plain chain, both against the CPU float32 reference (max |logit difference|).
3. Drafter invariance: basic-uwm, pfr and mpfr on the same key and seed must emit the same
   tokens; with stock GPU kernels (not batch-invariant) a near-tie can flip, so it reports the
   share of identical answers and the first differing position.
4. The cost model: c(B), a drafter level over B rows, and r(B, L), a verify forward over a tree
   of B x L nodes, in units of a one-token target forward, for B, L = 1..8, and the predicted
   speedup over basic-uwm, AATPS / (L c + r), with AATPS from a per-draft acceptance rate
   `--alpha` (B drafts accept a level with probability 1 - (1 - alpha)^B, an upper bound).

Checks 2-4 run twice, side by side: on each session's own growing cache (the slab path) and on
the static path (`wmark.generator.models.static_forward`: a cache allocated once, forwards
padded to fixed row counts, replayed as CUDA graphs on a GPU; run eagerly on the CPU). Then:

5. The one-token step: wmark's session step on both paths against the floor, the same forward
   replayed as a CUDA graph with nothing around it (GPU only).
6. End to end: `generate()` tokens/s of basic-uwm, of mpfr over the draft model and of the
   default sampler (`auto` drafter) on both paths.
7. Per built-in prompt set: the forwards each setting ran there on a CPU (`--counts`, made by
   `bench/draft_rules.py --save-counts`; the text, hence which forwards run, is the target's on
   any machine) priced with this machine's cost of a forward of each row count, on the static
   path: the predicted decode speedup of the default sampler (and prompt lookup alone) over
   basic-uwm.
8. The cost model again on the paper's shapes (a Llama-2-7B target and a 2-layer 68M drafter,
   random weights made on the device; tiny stand-ins with --small), on the static path.

Each section reports and goes on when another fails (a GPU hour is scarce). Exit status 1 when
a check fails.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import io
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = {
    "wmark": "core",
    "wmark.generator": "generator",
    "wmark.generator.baselines": "generator/baselines",
}


def _import_wmark_from_tree() -> None:
    """Make `import wmark.generator...` work from the checkout when wmark is not installed."""
    if importlib.util.find_spec("wmark") is not None:
        return
    for name, folder in _PACKAGES.items():
        spec = importlib.util.spec_from_file_location(
            name, ROOT / folder / "__init__.py", submodule_search_locations=[str(ROOT / folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


_import_wmark_from_tree()

from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec  # noqa: E402
from wmark.generator.cuda.graphs import CudaGraphs  # noqa: E402
from wmark.generator.cuda.prf import seed_uniforms_torch, seed_words  # noqa: E402
from wmark.generator.drafters.build import build_drafter  # noqa: E402
from wmark.generator.engine import SamplerConfig, generate  # noqa: E402
from wmark.generator.models.hf_session import HFModel  # noqa: E402
from wmark.generator.models.prepare import prepare_model  # noqa: E402
from wmark.generator.models.session_store import model_logits  # noqa: E402
from wmark.generator.models.static_cache import FixedCache  # noqa: E402
from wmark.generator.models.static_forward import StaticPlan  # noqa: E402
from wmark.prf import seed_uniforms  # noqa: E402

# Qwen2.5(-Coder)-1.5B-Instruct and -0.5B-Instruct, the embedded pair (their config.json shapes).
QWEN_SHAPES: dict[str, dict[str, Any]] = {
    "target": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
    },
    "drafter": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
    },
}
QWEN_COMMON: dict[str, Any] = {
    "vocab_size": 151936,
    "num_key_value_heads": 2,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
}
SMALL_SHAPES: dict[str, dict[str, Any]] = {
    "target": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    "drafter": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
}
SMALL_COMMON: dict[str, Any] = {"vocab_size": 512, "num_key_value_heads": 2, "max_position_embeddings": 2048}
# The paper's pair: a Llama-2-7B target and a 68M drafter (2 layers), for the cost model only.
PAPER_SHAPES: dict[str, dict[str, Any]] = {
    "target": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    },
    "drafter": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 2,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
    },
}
PAPER_SMALL: dict[str, dict[str, Any]] = {
    "target": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4},
    "drafter": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
}
EOS = 0
SHARPEN = 6.0  # output-layer scale: random models' near-uniform outputs get language-like entropy


def build(role: str, small: bool, seed: int) -> Qwen2ForCausalLM:
    """A random-weight Qwen2 model with the role's shapes, in float32 on the CPU: the device's
    model and the CPU reference are copies of it, so a check compares the same weights."""
    shapes, common = (SMALL_SHAPES, SMALL_COMMON) if small else (QWEN_SHAPES, QWEN_COMMON)
    config = Qwen2Config(**shapes[role], **common, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPEN * (64 / config.hidden_size) ** 0.5)
    return model


def on_device(model: Qwen2ForCausalLM, device: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    """A copy of `model` on `device` in `dtype`."""
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def check_prf(device: str) -> bool:
    rng = np.random.default_rng(0)
    ok = True
    for trial in range(4):
        seed = hashlib.sha256(b"gpu-check %d" % trial).digest()
        ids = rng.integers(0, 151936, size=4096)
        want = seed_uniforms(seed, ids[:, None], np.arange(1, 4)[None])
        got = (
            seed_uniforms_torch(
                seed_words(seed, device)[None, None],
                torch.as_tensor(ids, device=device)[:, None],
                torch.arange(1, 4, device=device)[None],
            )
            .cpu()
            .numpy()
        )
        ok &= bool(np.array_equal(want, got))
    print(
        f"PRF: torch on {device} vs numpy reference, 4 x 4096 x 3 uniforms: {'identical' if ok else 'DIFFER'}"
    )
    return ok


def _tree(branches: int, depth: int, rng: np.random.Generator, vocab: int) -> tuple[list[int], list[int]]:
    """B disjoint chains of L tokens under the root: (parents, tokens) in session order."""
    parents, tokens = [], []
    for _ in range(branches):
        for level in range(depth):
            parents.append(-1 if level == 0 else len(parents) - 1)
            tokens.append(int(rng.integers(1, vocab)))
    return parents, tokens


def check_tree(target: Qwen2ForCausalLM, reference: HFModel, device_model: HFModel, vocab: int) -> bool:
    """Tree logits vs each branch decoded as a chain, both vs the CPU float32 reference."""
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(1, vocab, size=48)]
    parents, tokens = _tree(4, 4, rng, vocab)
    _, tree_rows = device_model.session(prompt).extend(parents, tokens)
    _, ref_rows = reference.session(prompt).extend(parents, tokens)
    chain_rows = []
    for b in range(4):
        chain = tokens[4 * b : 4 * b + 4]
        _, rows = device_model.session(prompt).extend([-1, 0, 1, 2], chain)
        chain_rows.append(rows)
    chains = torch.cat(chain_rows).float().cpu()
    tree_err = float((tree_rows.float().cpu() - ref_rows).abs().max())
    chain_err = float((chains - ref_rows).abs().max())
    scale = float(ref_rows.abs().max())
    # A wrong mask or position, or other weights, errs by O(scale). Rounding alone: float32 agrees
    # to ~1e-6 of the scale; bf16 / fp16 keep 8 / 11 mantissa bits (~0.4 % / 0.05 % a rounding),
    # and a few dozen layers of it stay within a tenth of the scale.
    low = device_model.dtype in (torch.bfloat16, torch.float16)
    ok = chain_err <= (0.1 if low else 1e-3) * scale and tree_err <= 2 * chain_err + 1e-3 * scale
    print(
        f"tree attention (B=4 x L=4 after a 48-token prompt), max |logit - CPU fp32 reference| "
        f"(logits up to {scale:.1f}): tree {tree_err:.2e}, chains {chain_err:.2e}: {'ok' if ok else 'FAIL'}"
    )
    del target
    return ok


def check_invariance(target: HFModel, drafter: HFModel, vocab: int, tokens: int) -> tuple[int, int]:
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="random", sha256="3" * 64, vocab_size=vocab))
    key = KeyMaterial(key_id="wk_gpu", secret=Secret(hashlib.sha256(b"gpu key").digest()), spec=spec)
    same = total = 0
    rng = np.random.default_rng(2)
    for prompt_no in range(2):
        prompt = [int(t) for t in rng.integers(1, vocab, size=32)]
        runs = {}
        for name, method, drafts, model in (
            ("basic-uwm", "basic-uwm", 1, None),
            ("pfr L=4 (drafter)", "pfr", 1, drafter),
            ("mpfr B=4 L=4 (drafter)", "mpfr", 4, drafter),
            ("mpfr B=4 L=4 (target drafts)", "mpfr", 4, target),
        ):
            config = SamplerConfig(
                method=method, drafts=drafts, lookahead=4, draft_confidence=0.0, max_new_tokens=tokens
            )
            runs[name] = generate(target, prompt, config=config, key=key, drafter=model, seed=prompt_no)
        base = runs["basic-uwm"].token_ids
        for name, out in runs.items():
            if name == "basic-uwm":
                continue
            total += 1
            differ = next(
                (i for i, (a, b) in enumerate(zip(out.token_ids, base, strict=False)) if a != b), None
            )
            same += differ is None
            where = "identical" if differ is None else f"first differs at token {differ}"
            print(f"  prompt {prompt_no} {name}: AATPS {out.aatps:.2f}, {where}")
    print(f"drafter invariance: {same}/{total} answers identical to basic-uwm")
    return same, total


def _timed(fn: Any, device: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cost_model(target: HFModel, drafter: HFModel, vocab: int, device: str, reps: int, alpha: float) -> float:
    """Print c and r (and the predicted speedup); return the one-token step in seconds."""
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(1, vocab, size=256)]
    t_sess, d_sess = target.session(prompt), drafter.session(prompt)
    t_sess.extend([], [])
    d_sess.extend([], [])

    def one(session: Any, parents: list[int], tokens: list[int]) -> None:
        session.accept([], [int(rng.integers(1, vocab))])  # one committed token, as after a block
        session.extend(parents, tokens)

    base = _timed(lambda: one(t_sess, [], []), device, reps)
    c = {b: _timed(lambda b=b: one(d_sess, [-1] * b, [1] * b), device, reps) / base for b in range(1, 9)}
    r = {}
    for b in range(1, 9):
        for ell in range(1, 9):
            parents, tokens = _tree(b, ell, rng, vocab)
            r[b, ell] = _timed(lambda p=parents, t=tokens: one(t_sess, p, t), device, reps) / base
    print(f"\none-token target forward: {base * 1e3:.2f} ms; drafter level c(B) in those units:")
    print("| B | " + " | ".join(str(b) for b in range(1, 9)) + " |")
    print("|---|" + "---:|" * 8)
    print("| c | " + " | ".join(f"{c[b]:.3f}" for b in range(1, 9)) + " |")
    print("\nverify forward r(B, L) (tree of B x L nodes), same units:")
    print("| B \\ L | " + " | ".join(str(ell) for ell in range(1, 9)) + " |")
    print("|---|" + "---:|" * 8)
    for b in range(1, 9):
        print(f"| {b} | " + " | ".join(f"{r[b, ell]:.2f}" for ell in range(1, 9)) + " |")
    print(f"\npredicted speedup over basic-uwm, AATPS / (L c + r), per-draft acceptance alpha = {alpha}:")
    print("| B \\ L | " + " | ".join(str(ell) for ell in range(1, 9)) + " |")
    print("|---|" + "---:|" * 8)
    best = (0.0, 0, 0)
    for b in range(1, 9):
        level = 1 - (1 - alpha) ** b
        cells = []
        for ell in range(1, 9):
            aatps = sum(level**k for k in range(ell + 1))
            speedup = aatps / (ell * c[b] + r[b, ell])
            best = max(best, (speedup, b, ell))
            cells.append(f"{speedup:.2f}")
        print(f"| {b} | " + " | ".join(cells) + " |")
    print(f"best: {best[0]:.2f}x at B = {best[1]}, L = {best[2]}")
    return base


def graph_floor(lm: HFModel, context: int, reps: int) -> float:
    """Seconds of a one-token forward after `context` cached rows, replayed as a CUDA graph with
    no session around it: the floor wmark's step is measured against."""
    width = (context + 16) // 16 * 16  # the keys read, a multiple of 16 like the static path's
    cache = FixedCache.for_config(lm.model.config, width, lm.model.dtype, lm.device)
    cache.length, cache.read_width = context, width
    cache.write_index = torch.tensor([context], device=lm.device)
    ids = torch.ones(1, 1, dtype=torch.long, device=lm.device)
    positions = torch.full((1, 1), context, dtype=torch.long, device=lm.device)
    mask = torch.zeros(1, 1, 1, width, dtype=lm.dtype, device=lm.device)
    mask[..., context + 1 :] = torch.finfo(lm.dtype).min
    graphs = CudaGraphs()

    def step() -> None:
        with torch.inference_mode(), lm.plan.running():
            graphs.run("step", lambda: model_logits(lm, cache, ids, mask, positions))

    step()
    return _timed(step, "cuda", reps)


def paper_cost_model(small: bool, device: str, dtype: torch.dtype, reps: int, alpha: float) -> bool:
    """c, r and the predicted speedup for the paper's shapes (random weights made on the device,
    no CPU reference: timing only), on the static path (CUDA graphs on a GPU)."""
    shapes = PAPER_SMALL if small else PAPER_SHAPES
    vocab = 512 if small else 32000
    models = []
    for seed, role in enumerate(("target", "drafter")):
        config = LlamaConfig(**shapes[role], vocab_size=vocab, max_position_embeddings=4096)
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype).eval()
        models.append(
            HFModel(model, frozenset({EOS}), name=f"paper {role}", static=StaticPlan(graphs=device == "cuda"))
        )
    print(f"\n[paper's shapes: {'tiny stand-ins' if small else 'Llama-2-7B target, 68M drafter'}]")
    cost_model(models[0], models[1], vocab, device, reps, alpha)
    return True


def chain_costs(model: HFModel, sizes: list[int], vocab: int, device: str, reps: int) -> dict[int, float]:
    """Seconds of one forward over M new tokens (a chain) after a 300-token prompt, per M."""
    rng = np.random.default_rng(5)
    session = model.session([int(t) for t in rng.integers(1, vocab, size=300)])
    session.extend([], [])

    def forward(m: int) -> None:
        session.accept([], [])
        session.extend(list(range(-1, m - 1)), [int(t) for t in rng.integers(1, vocab, size=m)])

    return {m: _timed(lambda m=m: forward(m), device, reps) for m in sizes}


def prompt_set_predictions(
    path: Path, target: HFModel, drafter: HFModel, vocab: int, device: str, reps: int
) -> bool:
    """Price the forwards each setting ran on the built-in prompt sets on the CPU (`bench/
    draft_rules.py --save-counts`: the same text, hence the same forwards, on any machine) with
    this machine's cost of a forward of each row count: predicted decode speedup vs basic-uwm."""
    counts = json.loads(path.read_text())
    sizes: dict[str, set[int]] = {"target": set(), "drafter": set()}
    for settings in counts["sets"].values():
        for setting in settings.values():
            for role, histogram in setting["forwards"].items():
                sizes[role].update(int(m) for m in histogram)
    costs = {
        role: chain_costs(model, sorted(sizes[role]), vocab, device, reps)
        for role, model in (("target", target), ("drafter", drafter))
        if sizes[role]
    }

    def seconds(setting: dict[str, Any]) -> float:
        return sum(
            costs[role][int(m)] * n
            for role, histogram in setting["forwards"].items()
            for m, n in histogram.items()
        )

    print(f"\nprompt sets: the forwards of {counts['made_by']} ({counts['date']}), priced here")
    print("| set | setting | AATPS | predicted decode vs basic-uwm |")
    print("|---|---|---:|---:|")
    for set_name, settings in counts["sets"].items():
        base = seconds(settings["basic-uwm"])
        for name, setting in settings.items():
            aatps = setting["tokens"] / setting["blocks"]
            print(f"| {set_name} | {name} | {aatps:.2f} | {base / seconds(setting):.2f}x |")
    return True


def end_to_end(
    target: HFModel, drafter: Any, vocab: int, runs: tuple[tuple[str, SamplerConfig], ...]
) -> dict[str, float]:
    """tokens/s of generate() (prefill excluded) per (name, config), one prompt whose second half
    repeats its first (so prompt lookup finds matches, as in a text to summarise)."""
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="random", sha256="3" * 64, vocab_size=vocab))
    key = KeyMaterial(key_id="wk_gpu", secret=Secret(hashlib.sha256(b"gpu key").digest()), spec=spec)
    half = [int(t) for t in np.random.default_rng(4).integers(1, vocab, size=32)]
    speeds = {}
    for name, config in runs:
        generate(target, half + half, config=config, key=key, drafter=drafter, seed=0)  # warm (graphs)
        out = generate(target, half + half, config=config, key=key, drafter=drafter, seed=0)
        seconds = out.timings.draft + out.timings.verify + out.timings.bookkeeping
        speeds[name] = len(out.token_ids) / seconds
    return speeds


def end_to_end_table(paths: dict[str, tuple[HFModel, HFModel]], vocab: int, tokens: int) -> bool:
    """`end_to_end` of basic-uwm, mpfr B=2 L=4 over the draft model, and the default sampler
    (its `auto` drafter: prompt lookup, else the draft model with its output layer cut), per path."""
    fixed = (
        ("basic-uwm", SamplerConfig(method="basic-uwm", max_new_tokens=tokens)),
        (
            "mpfr B=2 L=4",
            SamplerConfig(method="mpfr", drafts=2, lookahead=4, draft_confidence=0.0, max_new_tokens=tokens),
        ),
    )
    speeds = {path: end_to_end(t, d, vocab, fixed) for path, (t, d) in paths.items()}
    default = (("default (auto)", SamplerConfig(max_new_tokens=tokens)),)
    for path, (t, d) in paths.items():  # after the rows above: `auto` cuts the draft model's head
        speeds[path].update(end_to_end(t, build_drafter("auto", t, d, int4=False), vocab, default))
    print(f"\nend to end, {tokens} tokens after a 64-token prompt (tokens/s, prefill excluded):")
    for path, row in speeds.items():
        print(f"  {path}: " + ", ".join(f"{m} {v:.1f}" for m, v in row.items()))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="tiny configs (a CPU check in seconds)")
    parser.add_argument(
        "--precision",
        default=None,
        choices=["bf16", "fp16", "fp32", "exact-fp32"],
        help="default: bf16 on cuda, exact-fp32 (batch-invariant) on cpu",
    )
    parser.add_argument("--tokens", type=int, default=48, help="tokens per answer in the invariance check")
    parser.add_argument(
        "--paper",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the cost model on the paper's shapes (7B target, 68M drafter; tiny with --small)",
    )
    parser.add_argument(
        "--counts",
        type=Path,
        default=ROOT / "bench" / "forward_counts.json",
        help="forwards per prompt set and setting, counted on a CPU (bench/draft_rules.py --save-counts)",
    )
    parser.add_argument("--e2e-tokens", type=int, default=128, help="tokens per end-to-end generation")
    parser.add_argument("--reps", type=int, default=5, help="timing repetitions (median)")
    parser.add_argument("--alpha", type=float, default=0.62, help="per-draft acceptance for the prediction")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (--device cpu; 1 resists a busy machine)"
    )
    args = parser.parse_args(argv)
    # every line reaches the caller as it is printed: a run stopped at its time limit keeps
    # what it measured (a pipe is block-buffered by default)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    precision = args.precision or ("bf16" if args.device == "cuda" else "exact-fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"device {args.device} ({name}), {precision}, "
        f"{'tiny' if args.small else 'Qwen2.5 1.5B / 0.5B'} shapes"
    )
    eos = frozenset({EOS})
    vocab = (SMALL_COMMON if args.small else QWEN_COMMON)["vocab_size"]
    target_cpu = build("target", args.small, seed=0)
    target_raw = on_device(target_cpu, args.device, dtype)
    drafter_raw = on_device(build("drafter", args.small, seed=1), args.device, dtype)
    target = HFModel(prepare_model(target_raw, precision, args.device), eos, name="target")
    drafter = HFModel(prepare_model(drafter_raw, precision, args.device), eos, name="drafter")
    graphs = args.device == "cuda"
    static_target = HFModel(target.model, eos, name="target (static)", static=StaticPlan(graphs=graphs))
    static_drafter = HFModel(drafter.model, eos, name="drafter (static)", static=StaticPlan(graphs=graphs))
    paths = {"slab": (target, drafter), "static": (static_target, static_drafter)}
    print(f"models built in {time.perf_counter() - start:.1f} s")
    ok = section("PRF", lambda: check_prf(args.device))
    reference = HFModel(prepare_model(target_cpu, "fp32", "cpu"), eos, name="reference")  # the same weights
    for path, (t, _) in paths.items():
        print(f"\n[{path} path]", end=" ")
        ok &= section(f"tree attention, {path}", lambda t=t, r=reference: check_tree(target_raw, r, t, vocab))
    del reference, target_cpu
    steps: dict[str, float] = {}
    for path, (t, d) in paths.items():
        print(f"\n[{path} path]")
        ok &= section(
            f"invariance, {path}", lambda t=t, d=d: bool(check_invariance(t, d, vocab, args.tokens))
        )
        ok &= section(
            f"cost model, {path}",
            lambda t=t, d=d, path=path: bool(
                steps.setdefault(path, cost_model(t, d, vocab, args.device, args.reps, args.alpha))
            ),
        )
    if graphs:
        ok &= section("floor", lambda: bool(steps.setdefault("floor", graph_floor(target, 256, args.reps))))
    print("\none-token step after a 256-token prompt (ms):")
    floor = steps.get("floor")
    for path, seconds in steps.items():
        ratio = f" ({seconds / floor:.2f}x the floor)" if floor and path != "floor" else ""
        print(f"  {path}: {seconds * 1e3:.2f}{ratio}")
    ok &= section("end to end", lambda: end_to_end_table(paths, vocab, args.e2e_tokens))
    if args.counts.is_file():
        ok &= section(
            "prompt sets",
            lambda: prompt_set_predictions(
                args.counts, static_target, static_drafter, vocab, args.device, args.reps
            ),
        )
    else:
        print(f"\nprompt sets: no counts at {args.counts} (bench/draft_rules.py --save-counts makes them)")
    if args.paper:
        ok &= section(
            "paper's shapes", lambda: paper_cost_model(args.small, args.device, dtype, args.reps, args.alpha)
        )
    print(f"\n{'all checks passed' if ok else 'A CHECK FAILED'} in {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


def section(name: str, run: Any) -> bool:
    """Run one check; an exception fails it (printed) and the script goes on. Each section's
    seconds are printed: the GPU run has a budget, and the next one should know where it went."""
    start = time.perf_counter()
    try:
        return bool(run())
    except Exception:  # noqa: BLE001 - reported, counted as a failure, the next check runs
        print(f"\n{name}: FAILED with an exception")
        traceback.print_exc(file=sys.stdout)
        return False
    finally:
        print(f"[{name}: {time.perf_counter() - start:.1f} s]", flush=True)


if __name__ == "__main__":
    sys.exit(main())
