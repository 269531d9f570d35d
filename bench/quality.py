"""How far each CPU build of the embedded models is from the float32 target, position by position.

    .venv/bin/python bench/quality.py [--docs 24] [--doc-tokens 192] [--limit 4] [--answer-tokens 128]

The reference is the embedded target at float32 (its GGUF dequantised: `--precision fp32`). Each
row is scored against it on the same texts, every position's next-token distribution through a
decoding session (the forward generation runs: the text after its first token, or after the
prompt, is one chain of draft nodes):

- `int8 (default)` (the CPU default with AMX): smoothed int8 weights
  (`wmark.generator.models.smoothing`) x int8 activations in two parts, the row and what its int8
  value left (`RowInt8Linear.activations` "two"), loaded as `wmark generate` loads it;
- `int8-fast` (`--precision int8-fast`, the CPU default without AMX): the same smoothing, the
  weights with a scale per channel and 128 input columns (`RowInt8Linear.scale_cols`), each
  activation row one int8 part plus its 16 largest channels in float32
  (`RowInt8Linear.activations` "outliers");
- `outliers, per-channel weights`: int8-fast's rows on the default's weights (int8-fast until
  2026-12-07);
- `two parts, block weights`: the default's rows on int8-fast's weights;
- `int8, one part`: the default with one int8 part per activation row (one scale per row);
- `int8 before`: neither smoothed nor in two parts (the default until 2026-12-05);
- `drafter` rows: the draft model as generation runs it (`build_drafter`: its vocabulary head
  cut to the first 32k tokens, its weights to 4 bits where this CPU runs 4-bit weights
  vectorised): now (not smoothed, activations in one part), smoothed as the target is, and
  before. A drafter only proposes, and gives the tokens past its head no probability (so no
  finite KL): its column is its overlap with the target it drafts for, sum_v min(p(v), q(v)),
  the probability that one draft token is accepted by speculative sampling (PFR's race accepts
  with the same probability).

Texts: the human corpus (`wmark.eval.corpus.system_corpus`: licences, package descriptions and
code found on this machine, none written by this project), the first `--doc-tokens` tokens of
the first `--docs` documents, scored after their first token; and answers to the built-in prompt
sets (the first `--limit` prompts of each), written by the default model (`basic-uwm`, seed =
the prompt's index) and scored after the chat-templated prompt.

Per row and texts: mean, 99th percentile and worst KL(float32 || row) in nats per position, the
perplexity ratio (row / float32, on the texts' own next tokens) with its 95 % interval, top-1
agreement, and the share of positions where float32's most likely token is outside the row's top
50 (the default `top_k`: the row could never emit the float model's choice there). The interval
resamples whole texts (a text's positions move together: one odd document shifts all of its
own), 2,000 times with a fixed seed, and takes the 2.5th and 97.5th percentiles of the ratio.
`--row NAME` (repeated) scores only the rows named (the float32 reference always runs): more
documents for one row in the same time.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import machine
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.detector import TextTokenizer
from wmark.eval.corpus import system_corpus
from wmark.eval.models import prompt_encoder
from wmark.eval.prompts import load_prompt_set
from wmark.generator.drafters.build import build_drafter
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models.embedded import DRAFTER, TARGET, prepare
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import load_pair
from wmark.generator.models.prepare import prepare_model
from wmark.generator.models.smoothing import calibration_ids

SETS = ("summaries-mini", "code-mini", "eli5-mini")
TOP_K = 50  # the default SamplerConfig.top_k
RESAMPLES = 2000  # bootstrap draws of the perplexity ratio's interval
ROWS = (
    "int8 (default)",
    "int8-fast",
    "outliers, per-channel weights",
    "two parts, block weights",
    "int8, one part",
    "int8 before",
    "drafter (default)",
    "drafter, smoothed",
    "drafter before",
)
DRAFTS_FOR = {  # a drafter row's overlap is with the target row it drafts for
    "drafter (default)": "int8 (default)",
    "drafter, smoothed": "int8 (default)",
    "drafter before": "int8 before",
}


@dataclass
class Text:
    """A scored text: the prompt the model reads first, then the tokens whose positions count."""

    corpus: str
    prompt: list[int]
    tokens: list[int]


@dataclass
class Row:
    """Per-position figures of one row against the float32 target, over one corpus."""

    kl: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    reference_nll: list[float] = field(default_factory=list)
    top1: list[bool] = field(default_factory=list)
    outside: list[bool] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)
    text: list[int] = field(default_factory=list)  # the index of each position's text

    def add(self, ref: torch.Tensor, other: torch.Tensor, targets: torch.Tensor, text: int) -> None:
        """`ref`, `other`: log-probabilities (positions x vocabulary, float64) of the next token
        at the positions of text number `text`."""
        self.text += [text] * len(targets)
        self.kl += (ref.exp() * (ref - other)).sum(-1).tolist()
        self.nll += (-other.gather(1, targets[:, None])[:, 0]).tolist()
        self.reference_nll += (-ref.gather(1, targets[:, None])[:, 0]).tolist()
        best = ref.argmax(-1)
        self.top1 += (other.argmax(-1) == best).tolist()
        self.outside += (~(other.topk(TOP_K, dim=-1).indices == best[:, None]).any(-1)).tolist()

    def summary(self) -> str:
        if not self.kl:  # a drafter: its overlap only
            return " | ".join([""] * 6 + [f"{np.mean(self.overlap):.3f}"])
        kl = np.array(self.kl)
        ratio = float(np.exp(np.mean(self.nll) - np.mean(self.reference_nll)))
        low, high = self.ratio_interval()
        cells = [
            f"{kl.mean():.4f}",
            f"{np.percentile(kl, 99):.4f}",
            f"{kl.max():.3f}",
            f"{ratio:.4f} [{low:.4f}, {high:.4f}]",
            f"{np.mean(self.top1):.2%}",
            f"{np.mean(self.outside):.2%}",
            f"{np.mean(self.overlap):.3f}" if self.overlap else "",
        ]
        return " | ".join(cells)

    def ratio_interval(self, draws: int = RESAMPLES) -> tuple[float, float]:
        """The perplexity ratio's 95 % interval, resampling whole texts (see the module)."""
        texts = np.array(self.text)
        gap = np.array(self.nll) - np.array(self.reference_nll)
        ids = np.unique(texts)
        sums = np.array([gap[texts == i].sum() for i in ids])
        counts = np.array([(texts == i).sum() for i in ids])
        picks = np.random.default_rng(0).integers(0, len(ids), size=(draws, len(ids)))
        ratios = np.exp(sums[picks].sum(1) / counts[picks].sum(1))
        return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def log_probs(model: HFModel, text: Text) -> torch.Tensor:
    """Next-token log-probabilities at each of `text.tokens`' positions (float64)."""
    session = model.session(text.prompt)
    root, chain = session.extend(list(range(-1, len(text.tokens) - 2)), text.tokens[:-1])
    logits = torch.cat([root[None], chain])[:, : model.vocab_size].to(torch.float64)
    return torch.log_softmax(logits, -1)


def human_texts(docs: int, tokens: int, tokenizer: TextTokenizer) -> list[Text]:
    out = []
    for doc in system_corpus(limit=docs):
        ids = [int(t) for t in tokenizer.encode(doc.text)[: tokens + 1]]
        out.append(Text("human corpus", ids[:1], ids[1:]))
    return out


def answer_texts(pair, limit: int, tokens: int, tokenizer: TextTokenizer) -> list[Text]:  # noqa: ANN001
    key = KeyMaterial(
        key_id="wk_quality",
        secret=Secret(hashlib.sha256(b"quality").digest()),
        spec=WatermarkSpec(tokenizer=tokenizer.ref),
    )
    encode = prompt_encoder(pair, chat=True)
    out = []
    for set_name in SETS:
        for i, prompt in enumerate(load_prompt_set(set_name, limit=limit).prompts):
            ids = encode(prompt)
            answer = generate(
                pair.target,
                ids,
                config=SamplerConfig(method="basic-uwm", max_new_tokens=tokens),
                key=key,
                seed=i,
            )
            out.append(Text("answers", ids, [int(t) for t in answer.token_ids]))
            print(f"  answer {set_name} {i}: {len(answer.token_ids)} tokens", flush=True)
    return out


def _float_model(path) -> HFModel:  # noqa: ANN001
    return HFModel(
        prepare_model(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), "fp32", "cpu"),
        frozenset(),
    )


def _rows(model: torch.nn.Module, activations: str) -> torch.nn.Module:
    """`model` (in place) with its rows quantised as `activations` says (`RowInt8Linear`)."""
    for layer in int8_layers(model):
        layer.activations = activations
    return model


def _unsmoothed(path) -> HFModel:  # noqa: ANN001
    """The float checkpoint quantised without smoothing, activations in one part."""
    model = prepare_model(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), "int8", "cpu")
    return HFModel(model, frozenset())


def _smoothed(path) -> HFModel:  # noqa: ANN001
    """The float checkpoint smoothed (as the target is), then quantised; activations in one part."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    calibration = calibration_ids(AutoTokenizer.from_pretrained(str(path)))
    return HFModel(prepare_model(model, "int8", "cpu", calibration=calibration), frozenset())


def _as_drafter(model: HFModel, target: HFModel) -> HFModel:
    drafter = build_drafter("embedded", target, model)
    assert isinstance(drafter, HFModel)
    return drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--doc-tokens", type=int, default=192)
    parser.add_argument("--limit", type=int, default=4, help="prompts of each built-in set (x3 sets)")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--row", action="append", choices=ROWS, help="a row to score (repeat it; default: every row)"
    )
    args = parser.parse_args()
    chosen = args.row or list(ROWS)
    for name in chosen:
        if DRAFTS_FOR.get(name, name) not in chosen:
            parser.error(f"{name!r} is scored against {DRAFTS_FOR[name]!r}: add --row {DRAFTS_FOR[name]!r}")
    start = time.perf_counter()

    pair = load_pair("embedded", "embedded", precision="int8", threads=args.threads)  # as generation loads
    assert pair.drafter is not None
    tokenizer = TextTokenizer(pair.tokenizer_json, "qwen2.5-coder")
    texts = human_texts(args.docs, args.doc_tokens, tokenizer)
    if args.limit > 0:
        texts += answer_texts(pair, args.limit, args.answer_tokens, tokenizer)
    print(f"texts ready ({time.perf_counter() - start:.0f} s)", flush=True)

    rows: dict[tuple[str, str], Row] = {}
    target_float = prepare(TARGET, weights="float32")
    drafter_float = functools.cache(lambda: prepare(DRAFTER, weights="float32"))  # only for its rows
    before = functools.cache(lambda: _unsmoothed(target_float))
    fast = functools.cache(
        lambda: load_pair("embedded", None, precision="int8-fast", threads=args.threads).target
    )
    models: dict[str, Callable[[], HFModel]] = {
        "int8 (default)": lambda: pair.target,
        "int8-fast": fast,
        "outliers, per-channel weights": lambda: HFModel(
            _rows(copy.deepcopy(pair.target.model), "outliers"), frozenset()
        ),
        "two parts, block weights": lambda: HFModel(_rows(copy.deepcopy(fast().model), "two"), frozenset()),
        "int8, one part": lambda: HFModel(_rows(copy.deepcopy(pair.target.model), "one"), frozenset()),
        "int8 before": before,
        "drafter (default)": lambda: _as_drafter(pair.drafter, pair.target),
        "drafter, smoothed": lambda: _as_drafter(_smoothed(drafter_float()), pair.target),
        "drafter before": lambda: _as_drafter(_unsmoothed(drafter_float()), before()),
    }
    assert set(models) == set(ROWS)
    reference = _float_model(target_float)
    loaded = {name: models[name]() for name in ROWS if name in chosen}
    print(f"models loaded ({time.perf_counter() - start:.0f} s)", flush=True)
    for n, text in enumerate(texts):
        targets = torch.tensor(text.tokens)
        ref = log_probs(reference, text)
        found = {name: log_probs(model, text) for name, model in loaded.items()}
        for name, lp in found.items():
            row = rows.setdefault((text.corpus, name), Row())
            if name not in DRAFTS_FOR:
                row.add(ref, lp, targets, n)
            else:
                row.overlap += torch.minimum(found[DRAFTS_FOR[name]].exp(), lp.exp()).sum(-1).tolist()
        print(f"  text {n + 1}/{len(texts)} ({text.corpus}, {len(text.tokens)} positions)", flush=True)

    print(f"\n{len(texts)} texts, {time.perf_counter() - start:.0f} s; threads {args.threads}")
    print(f"{machine.describe()}\n")
    print(
        "| texts | row | positions | mean KL | p99 KL | worst KL | ppl ratio [95 % interval] | top-1 "
        "| fp32 argmax outside top-50 | draft overlap |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (corpus, name), row in rows.items():
        print(f"| {corpus} | {name} | {len(row.kl) or len(row.overlap)} | {row.summary()} |")


if __name__ == "__main__":
    main()
