"""What two-part activations cost in generation: the default int8 target (each activation row
quantised in two parts, `RowInt8Linear.activations` "two") against the same weights with one part (one
int8 scale per row, as before), side by side.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/int8_residual_speed.py [--limit 4] [--tokens 128]

Rows: `basic-uwm` (one target forward per token) and `default` (mpfr with the `auto` drafter,
`wmark generate`'s settings), each with the two-part target ("two parts") and the one-part one
("one part"; the drafter is one-part in both), the four alternating prompt by prompt on the
first `--limit` prompts of each built-in set, so that drift of this shared machine hits them
alike. Smoothing costs nothing at run time (it changes weights, not work), so this is the whole
speed difference between the default and the int8 path before it. Reports tokens/s end to end
and for decoding alone (the prompt's prefill left out), and the ratios two parts / one part.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
from collections import defaultdict

from generate_speed import SETTINGS, sampler_config
from quality import _rows

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import TextTokenizer
from wmark.eval.models import prompt_encoder
from wmark.eval.prompts import load_prompt_set
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
    args = parser.parse_args()

    pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)
    assert pair.drafter is not None
    target, draft_model = pair.target, pair.drafter

    def one_part(model: HFModel) -> HFModel:
        return HFModel(
            _rows(copy.deepcopy(model.model), "one"),
            model.eos_token_ids,
            model.name,
            tokenizer_sha256=model.tokenizer_sha256,
            gemm_threads=model.plan.gemm_threads,
        )

    one_target = one_part(target)
    builds = {
        "two parts": (target, build_drafter("auto", target, draft_model)),
        "one part": (one_target, build_drafter("auto", one_target, draft_model)),
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
    for set_name in SETS:
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

    print(f"\n{args.limit} prompts x {len(SETS)} sets, {args.tokens} tokens, threads {args.threads}\n")
    print("| setting | two parts tokens/s | one part tokens/s | two / one | decode alone: two / one |")
    print("|---|---:|---:|---:|---:|")
    for setting in ("basic-uwm", "default"):
        two, one = (tokens[setting, b] / seconds[setting, b] for b in builds)
        two_d, one_d = (tokens[setting, b] / decode[setting, b] for b in builds)
        print(f"| {setting} | {two:.2f} | {one:.2f} | {two / one:.3f}x | {two_d / one_d:.3f}x |")


if __name__ == "__main__":
    main()
