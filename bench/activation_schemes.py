"""Activation quantisations the int8 GEMM could run, by fake quantisation, against float32.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/activation_schemes.py [--docs 24] [--answers 4] \
        [--modes two,one,one+s16,one+d16]

Before a scheme is worth a kernel, this says whether it keeps the model. The default target's
own weights (smoothed and rounded to int8 as `wmark generate` loads them, then dequantised) run
in float32 through transformers' forward; each linear layer's input is quantised per row as the
kernel quantises (q = round(x * 127 / peak), ties to even) in one of these modes:

- `two`: two int8 parts, the row and what its int8 value left (the default kernel's, for
  calibration of the method: it should reproduce bench/quality.py's default row);
- `one`: one int8 part (one scale per row);
- `one+sN`: one part over all channels but N kept in float32, the same N per layer: those with
  the largest peaks on the shipped calibration text (`smoothing.calibration_ids`), what a
  conversion could fix;
- `one+dN`: one part over all channels but each row's own N largest in magnitude, kept in
  float32 (LLM.int8()'s idea, per row: a row's result still depends on that row alone).

Texts and scores are bench/quality.py's: the human corpus (the first `--doc-tokens` tokens of
the first `--docs` documents) and the default model's answers to the first `--answers` prompts of
each built-in set; mean, 99th percentile and worst KL(float32 || mode) per position, the
perplexity ratio with its 95 % interval, top-1 agreement. For the `one+d16` mode it also prints how
many distinct channels the top-16 sets of 9 consecutive rows make together (the columns a
kernel's side product would read for a verify forward of 9 rows).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import machine
import quality
import torch
from torch import nn
from transformers import AutoTokenizer

from wmark.detector import TextTokenizer
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.models.embedded import TARGET, prepare
from wmark.generator.models.fused import _Slice
from wmark.generator.models.loading import load_pair
from wmark.generator.models.smoothing import calibration_ids

UNION_ROWS = 9  # a verify forward's rows, for the side product's column count


class Quantiser:
    """Each linear layer's input quantisation, by mode (see the module); also gathers the
    calibration peaks and the top-16 unions."""

    def __init__(self) -> None:
        self.mode = "float"
        self.peaks: dict[int, torch.Tensor] = {}
        self.static: dict[int, dict[int, torch.Tensor]] = defaultdict(dict)  # N -> layer -> channels
        self.unions: list[int] = []

    def fix_static(self, counts: tuple[int, ...]) -> None:
        for count in counts:
            for layer, peak in self.peaks.items():
                self.static[count][layer] = peak.topk(count).indices

    def __call__(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        mode = self.mode
        if mode == "float":
            return x
        if mode == "calibrate":
            peak = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
            self.peaks[layer] = torch.maximum(self.peaks[layer], peak) if layer in self.peaks else peak
            return x
        if mode == "two":
            first = _one_part(x)
            return first + _one_part(x - first)
        if mode == "one":
            return _one_part(x)
        if mode.startswith("one+s"):
            channels = self.static[int(mode[5:])][layer]
            rest = x.clone()
            rest[..., channels] = 0
            out = _one_part(rest)
            out[..., channels] = x[..., channels]
            return out
        if mode.startswith("one+d"):
            count = int(mode[5:])
            top = x.abs().topk(count, dim=-1).indices
            if count == 16:
                rows = top.reshape(-1, count)
                for i in range(0, rows.shape[0] - UNION_ROWS + 1, UNION_ROWS):
                    self.unions.append(len(set(rows[i : i + UNION_ROWS].flatten().tolist())))
            out = _one_part(x.scatter(-1, top, 0.0))
            return out.scatter(-1, top, x.gather(-1, top))
        raise ValueError(f"unknown mode {mode!r}")


def _one_part(x: torch.Tensor) -> torch.Tensor:
    """x rounded to one int8 part per row, as the kernel rounds it (then dequantised)."""
    peak = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    return torch.round(x * (127.0 / peak)) * (peak / 127.0)


class FakeQuantLinear(nn.Module):
    """A float32 linear layer on int8-rounded weights whose input goes through the quantiser."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, layer: int, quantiser: Quantiser
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.layer, self.quantiser = layer, quantiser
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.quantiser(x, self.layer), self.weight, self.bias)


def _dequantised(linear: RowInt8Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight, scale = linear.int8_weight()
    dense = (weight.to(torch.float64) * scale.to(torch.float64)[:, None]).to(torch.float32)
    return dense, None if linear.bias is None else linear.bias.detach().float()


def fake_quantised(model: nn.Module, quantiser: Quantiser) -> int:
    """Replace `model`'s int8 layers (in place) by `FakeQuantLinear`s; the members of a fused
    group share one input and one quantiser entry. Returns the count of distinct inputs."""
    inputs: dict[int, int] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, _Slice):
                weight, bias = _dequantised(child.group.linear)
                layer = inputs.setdefault(id(child.group), len(inputs))
                rows = slice(child.start, child.stop)
                new = FakeQuantLinear(
                    weight[rows].clone(), None if bias is None else bias[rows].clone(), layer, quantiser
                )
            elif isinstance(child, RowInt8Linear):
                weight, bias = _dequantised(child)
                new = FakeQuantLinear(weight, bias, inputs.setdefault(id(child), len(inputs)), quantiser)
            else:
                continue
            setattr(parent, name, new)
    model.config._attn_implementation = "sdpa"
    return len(inputs)


@torch.inference_mode()
def log_probs(model: nn.Module, text: quality.Text, vocab: int) -> torch.Tensor:
    """Next-token log-probabilities (float64) at each of `text.tokens`' positions."""
    ids = text.prompt + text.tokens
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :, :vocab]
    return torch.log_softmax(logits.to(torch.float64), -1)[len(text.prompt) - 1 : -1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--doc-tokens", type=int, default=192)
    parser.add_argument("--answers", type=int, default=0, help="prompts of each built-in set (x3 sets)")
    parser.add_argument("--modes", default="two,one,one+s16,one+d16", help="comma-separated (see the module)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    modes = args.modes.split(",")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    pair = load_pair("embedded", None, precision="int8", threads=args.threads)
    tokenizer = TextTokenizer(pair.tokenizer_json, "qwen2.5-coder")
    texts = quality.human_texts(args.docs, args.doc_tokens, tokenizer)
    if args.answers:
        texts += quality.answer_texts(pair, args.answers, 128, tokenizer)  # before the layers change
    vocab = pair.target.vocab_size
    quantiser = Quantiser()
    model = pair.target.model
    inputs = fake_quantised(model, quantiser)
    float_path = prepare(TARGET, weights="float32")
    quantiser.mode = "calibrate"
    with torch.inference_mode():
        for ids in calibration_ids(AutoTokenizer.from_pretrained(str(float_path))):
            model(input_ids=torch.tensor([ids]), use_cache=False)
    quantiser.fix_static(tuple(int(m[5:]) for m in modes if m.startswith("one+s")))
    reference = quality._float_model(float_path).model  # noqa: SLF001 - the same reference as quality.py
    reference.config._attn_implementation = "sdpa"
    print(f"{inputs} quantised layer inputs; models ready ({time.perf_counter() - start:.0f} s)", flush=True)

    rows: dict[tuple[str, str], quality.Row] = {}
    for n, text in enumerate(texts):
        targets = torch.tensor(text.tokens)
        ref = log_probs(reference, text, vocab)
        for mode in modes:
            quantiser.mode = mode
            rows.setdefault((text.corpus, mode), quality.Row()).add(
                ref, log_probs(model, text, vocab), targets, n
            )
        print(f"  text {n + 1}/{len(texts)} ({text.corpus}, {len(text.tokens)} positions)", flush=True)

    print(f"\n{len(texts)} texts, {time.perf_counter() - start:.0f} s; threads {args.threads}")
    print(f"{machine.describe()}\n")
    print(
        "| texts | mode | positions | mean KL | p99 KL | worst KL | ppl ratio [95 % interval] | top-1 "
        "| fp32 argmax outside top-50 | |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for (corpus, mode), row in rows.items():
        print(f"| {corpus} | {mode} | {len(row.kl)} | {row.summary()} |")
    if quantiser.unions:
        unions = sorted(quantiser.unions)
        mean, median, p90 = statistics.mean(unions), statistics.median(unions), unions[int(0.9 * len(unions))]
        print(f"\ntop-16 channels of {UNION_ROWS} consecutive rows, distinct: mean {mean:.1f}, ", end="")
        print(f"median {median:.0f}, 90th percentile {p90}")


if __name__ == "__main__":
    main()
