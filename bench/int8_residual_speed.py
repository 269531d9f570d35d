"""What two-part activations cost in generation: the default int8 target (each activation row
quantised in two parts, `RowInt8Linear.activations` "two") against the same weights with its
rows quantised another way (`--against one`: one int8 scale per row, as before; `--against
outliers`: one part plus each row's 16 largest channels in float; `--against fast`: that on
weights with a scale per 128 columns, `--precision int8-fast`'s target), side by side.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/int8_residual_speed.py [--limit 4] [--tokens 128]
        [--against one|outliers|fast] [--prompt-sets summaries-mini,code-mini,eli5-mini]
        [--kernel avx512vnni]

`--kernel` runs every GEMM on one build (`_int8_gemm.use_backend`): `avx512vnni` on an AMX CPU
times what a CPU without AMX runs.

Rows: `basic-uwm` (one target forward per token) and `default` (mpfr with the `auto` drafter,
`wmark generate`'s settings), each with the two-part target ("two parts") and the other one
(the drafter is one-part in both), the four alternating prompt by prompt on the first
`--limit` prompts of each set, so that drift of this shared machine hits them alike.
Smoothing costs nothing at run time (it changes weights, not work), so this is the whole speed
difference between the two targets (with `fast`, its block scales' work too). Reports tokens/s
end to end and for decoding alone (the prompt's prefill left out), the ratios two parts / the
other, and per target the default over `basic-uwm` (the speedup issue 35 asks of summaries).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
from collections import defaultdict

import machine
from generate_speed import SETTINGS, sampler_config
from quality import _rows

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import TextTokenizer
from wmark.eval.models import prompt_encoder
from wmark.eval.prompts import load_prompt_set
from wmark.generator.cpu import _int8_gemm
from wmark.generator.drafters.build import build_drafter
from wmark.generator.engine import generate
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import load_pair

SETS = ("summaries-mini", "code-mini", "eli5-mini")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4, help="prompts of each built-in set (x3 sets)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--against", choices=("one", "outliers", "fast"), default="one")
    parser.add_argument("--prompt-sets", default=",".join(SETS))
    parser.add_argument("--kernel", choices=_int8_gemm.backends(), default=None, help="force one GEMM build")
    args = parser.parse_args()
    other = {"one": "one part", "outliers": "outliers", "fast": "int8-fast"}[args.against]
    if args.kernel:
        _int8_gemm.use_backend(args.kernel)

    pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)
    assert pair.drafter is not None
    target, draft_model = pair.target, pair.drafter

    def rows_as(model: HFModel, activations: str) -> HFModel:
        return HFModel(
            _rows(copy.deepcopy(model.model), activations),
            model.eos_token_ids,
            model.name,
            tokenizer_sha256=model.tokenizer_sha256,
            gemm_threads=model.plan.gemm_threads,
        )

    if args.against == "fast":
        other_target = load_pair("embedded", None, precision="int8-fast", threads=args.threads).target
    else:
        other_target = rows_as(target, args.against)
    builds = {
        "two parts": (target, build_drafter("auto", target, draft_model)),
        other: (other_target, build_drafter("auto", other_target, draft_model)),
    }
    tokenizer = TextTokenizer(pair.tokenizer_json, "qwen2.5-coder")
    key = KeyMaterial(
        key_id="wk_bench",
        secret=Secret(hashlib.sha256(b"bench key").digest()),
        spec=WatermarkSpec(tokenizer=tokenizer.ref),
    )
    encode = prompt_encoder(pair, chat=True)
    tokens: dict[tuple[str, str], int] = defaultdict(int)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    decode: dict[tuple[str, str], float] = defaultdict(float)
    sets = args.prompt_sets.split(",")
    for set_name in sets:
        for i, prompt in enumerate(load_prompt_set(set_name, limit=args.limit).prompts):
            ids = encode(prompt)
            for setting in ("basic-uwm", "default"):
                for build, (model, drafter) in builds.items():
                    out = generate(
                        model,
                        ids,
                        config=sampler_config(SETTINGS[setting], args.tokens),
                        key=key,
                        drafter=drafter if setting != "basic-uwm" else None,
                        seed=i,
                    )
                    tokens[setting, build] += len(out.token_ids)
                    seconds[setting, build] += out.timings.total
                    decode[setting, build] += out.timings.decode
                    print(
                        f"  {set_name} {i} {setting:>9} {build:>9}: {out.tokens_per_s:.2f} tok/s", flush=True
                    )

    print(f"\n{args.limit} prompts x {len(sets)} sets, {args.tokens} tokens, threads {args.threads}")
    print(f"{machine.describe()}\n")
    print(f"| setting | two parts tokens/s | {other} tokens/s | two / {other} | decode: two / {other} |")
    print("|---|---:|---:|---:|---:|")
    speed = {key: tokens[key] / seconds[key] for key in tokens}
    for setting in ("basic-uwm", "default"):
        two, alt = (speed[setting, b] for b in builds)
        two_d, alt_d = (tokens[setting, b] / decode[setting, b] for b in builds)
        print(f"| {setting} | {two:.2f} | {alt:.2f} | {two / alt:.3f}x | {two_d / alt_d:.3f}x |")
    for build in builds:
        print(f"default / basic-uwm, {build}: {speed['default', build] / speed['basic-uwm', build]:.2f}x")


if __name__ == "__main__":
    main()
