"""Activation smoothing before int8 quantisation, so that the int8 model stays the user's model.

Why: the int8 precision quantises each activation row with one scale, its peak
(`wmark.generator.cpu.rowwise`). Qwen2.5's hidden states carry a few channels hundreds of times
larger than the rest, so one scale per row leaves every other channel a handful of levels: on
the embedded target that made the int8 model a 4-bit-class loss away from the float one
(BENCHMARKS.md, "Quality"). A target's activations now also go in two int8 parts
(`RowInt8Linear.activations` "two"), which takes the outliers themselves; smoothing stays for the weights,
whose per-channel int8 rounding a low strength (`ALPHA`; `ALPHA_OUTPUT` for the attention
output projection) evens out across columns.

What (SmoothQuant: Xiao et al., ICML 2023): each input channel j of a linear layer gets a factor
s_j = peak_x(j)^ALPHA / peak_w(j)^(1 - ALPHA), from the channel's peak activation on a fixed
calibration text and its weight column's peak. The layer then computes (x / s) (W diag(s))^T,
which is x W^T in exact arithmetic: the activation outliers move into the weights, which are
quantised per output channel and take them far better. Dividing x by s costs nothing at run time:
it is folded into what produces x, once, in the float weights, before quantisation:

- q/k/v read the input RMSNorm: its weight is divided by s;
- gate/up read the post-attention RMSNorm: the same;
- o_proj reads attention's weighted sum of values: v_proj's rows and bias are divided by s (with
  grouped-query attention the query heads sharing a value head share its factors: the largest
  peak among them decides);
- down_proj reads silu(gate) * up: up_proj's rows are divided by s;
- lm_head reads the final RMSNorm: its weight is divided by s.

Nothing here is data-dependent at run time: the factors are fixed at conversion, so a row's
logits still depend on that row alone (batch invariance). The calibration text ships with wmark
(`calibration.jsonl`: eight short conversations, code, explanations and a summary, written for
this purpose; none of the evaluation corpora), so every conversion measures the same thing; but
the measuring forward is float32 through torch's BLAS, whose rounding depends on the CPU's
instruction set, so two kinds of CPU convert to almost, not exactly, the same int8 weights
(the embedded target's peaks through MKL's AVX-512 and AVX2 code paths: 94 % of channel peaks
differed, by at most 1.4e-4 relatively, and 8,305 of its 1.54 billion int8 weights by one level;
the same instruction set gave the same bits at one thread and two). A cache is converted on the
machine that uses it, so a machine's own generations are reproducible; another kind of CPU
may, rarely, emit another token where two were nearly tied.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch
from torch import nn

__all__ = ["ALPHA", "ALPHA_OUTPUT", "VERSION", "Smoothing", "calibration_ids", "measure", "smooth_model"]

ALPHA = 0.25
"""How much of an activation outlier moves into the weights (SmoothQuant's migration strength).
With a target's activations quantised in two parts (`RowInt8Linear.activations` "two", ~16 bits) the
loss left is the weights': a low strength mostly evens out the weight columns' peaks, which
per-channel int8 weights take best. Measured by fake quantisation on human text (mean KL to
float32): 0 -> 0.0054, 0.1 -> 0.0022, 0.25 -> 0.0010, 0.5 -> 0.0023 (BENCHMARKS.md, "Quality"; 0.5
was best while activations had one 8-bit part)."""

ALPHA_OUTPUT = 0.5
"""The strength of the attention output projection's factors (folded into v_proj's rows). Measured
by the same fake quantisation on 24 human documents, with every other layer at `ALPHA`: 0.25 ->
mean KL 0.00116, p99 0.0163, worst 0.059, perplexity ratio 1.0032; 0.5 -> 0.00110, 0.0152,
0.046, 1.0020 (BENCHMARKS.md, "Quality")."""

VERSION = "smoothquant-a0.25-o0.5-cal1"
"""Names the smoothing (its rule, strengths and calibration text) in the int8 caches it shaped: a cache
built another way is rebuilt, not read."""

_HEAD = "lm_head"


def calibration_ids(tokenizer: Any) -> list[list[int]]:
    """The calibration conversations as token IDs: through the tokenizer's chat template where it
    has one (what generation feeds the model), else the contents joined by blank lines."""
    text = resources.files("wmark.generator.models").joinpath("calibration.jsonl").read_text("utf-8")
    out: list[list[int]] = []
    for line in text.splitlines():
        messages = json.loads(line)["messages"]
        if getattr(tokenizer, "chat_template", None):
            encoded = tokenizer.apply_chat_template(messages, tokenize=True)
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        else:
            joined = "\n\n".join(m["content"] for m in messages)
            ids = tokenizer(joined, add_special_tokens=False)["input_ids"]
        out.append([int(i) for i in ids])
    return out


@dataclass
class Peaks:
    """Per input channel: the largest |activation| seen (`act`) and |weight| in the column (`weight`),
    by linear layer name (float64)."""

    act: dict[str, torch.Tensor] = field(default_factory=dict)
    weight: dict[str, torch.Tensor] = field(default_factory=dict)


class _Stop(Exception):
    """Raised by the output layer's hook: calibration needs its input, not the logits."""


def _linears(model: nn.Module, kinds: tuple[type, ...]) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if any(isinstance(module, kind) for kind in kinds):
            yield name, module


def measure(
    model: nn.Module,
    batches: Sequence[Sequence[int]],
    *,
    kinds: tuple[type, ...] = (nn.Linear,),
    column_peaks: Callable[[str, nn.Module], torch.Tensor] | None = None,
) -> Peaks:
    """Run `model` (a float causal LM) on the token ID sequences `batches` and record every linear
    layer's input peaks per channel; the output layer is not computed (its input is all it needs).

    The sequences run as one batch, right-padded under an attention mask (a layer whose weights
    are dequantised per call, `gguf_calibration`, does it once), and the padding's positions
    are left out of the peaks: under the causal mask no real position sees them.

    Args:
        kinds: the module types that are the model's linear layers.
        column_peaks: a layer's weight column peaks (default: from its `weight`).
    """
    peaks = Peaks()
    sequences = [list(ids) for ids in batches if len(ids)]
    width = max((len(ids) for ids in sequences), default=0)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    real = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        real[row, : len(seq)] = True

    def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach()
            peaks.act[name] = x[real].abs().amax(dim=0).to(torch.float64)
            if name == _HEAD:
                raise _Stop

        return record

    layers = list(_linears(model, kinds))
    handles = [module.register_forward_pre_hook(hook(name)) for name, module in layers]
    try:
        with torch.inference_mode(), contextlib.suppress(_Stop):
            if sequences:
                model(ids, attention_mask=real.long(), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    for name, module in layers:
        if column_peaks is not None:
            peaks.weight[name] = column_peaks(name, module).to(torch.float64)
        else:
            weight: torch.Tensor = module.weight  # type: ignore[assignment]
            peaks.weight[name] = weight.detach().abs().amax(dim=0).to(torch.float64)
    return peaks


def _factor(act: torch.Tensor, weight: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """SmoothQuant's s = peak_x^alpha / peak_w^(1 - alpha) (peaks floored at 1e-5, as its authors do)."""
    return act.clamp_min(1e-5).pow(alpha) / weight.clamp_min(1e-5).pow(1 - alpha)


@dataclass(frozen=True)
class Smoothing:
    """The factors of one model, and how its float tensors change for them.

    `columns`: linear layer name -> the factor of each of its input channels (weight columns
    are multiplied by it). `rows`: linear layer name -> a divisor of each output channel (the
    layer produces a smoothed input: v_proj, up_proj). `dense`: parameter name (a norm's weight,
    v_proj's bias) -> its divisor.
    """

    columns: Mapping[str, torch.Tensor]
    rows: Mapping[str, torch.Tensor]
    dense: Mapping[str, torch.Tensor]

    @classmethod
    def plan(cls, peaks: Peaks, config: Any) -> Smoothing | None:
        """The factors for a Qwen2 / Llama-style decoder (None if `peaks` do not name its layers)."""
        columns: dict[str, torch.Tensor] = {}
        rows: dict[str, torch.Tensor] = {}
        dense: dict[str, torch.Tensor] = {}
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}"
            attn, mlp = f"{p}.self_attn", f"{p}.mlp"
            names = [f"{attn}.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            names += [f"{mlp}.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
            if not all(n in peaks.act and n in peaks.weight for n in names):
                return None
            q, k, v, o, gate, up, down = names
            for group, norm in (
                ((q, k, v), f"{p}.input_layernorm"),
                ((gate, up), f"{p}.post_attention_layernorm"),
            ):
                s = _factor(peaks.act[group[0]], torch.stack([peaks.weight[n] for n in group]).amax(dim=0))
                columns.update(dict.fromkeys(group, s))
                dense[f"{norm}.weight"] = s

            # o_proj: one factor per value channel, shared by the query heads that read it
            def per_value(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(kv_heads, heads // kv_heads, head_dim).amax(dim=1)

            s_v = _factor(per_value(peaks.act[o]), per_value(peaks.weight[o]), ALPHA_OUTPUT)
            columns[o] = s_v[:, None, :].expand(kv_heads, heads // kv_heads, head_dim).reshape(-1)
            rows[v] = s_v.reshape(-1)
            dense[f"{v}.bias"] = s_v.reshape(-1)
            s_d = _factor(peaks.act[down], peaks.weight[down])
            columns[down], rows[up] = s_d, s_d
        if _HEAD in peaks.act:
            s_h = _factor(peaks.act[_HEAD], peaks.weight[_HEAD])
            columns[_HEAD] = s_h
            dense["model.norm.weight"] = s_h
        return cls(columns, rows, dense)

    def weight(self, name: str, weight: torch.Tensor, first_row: int = 0) -> torch.Tensor:
        """Linear layer `name`'s float32 weight rows (from `first_row` on) as the int8 path quantises
        them: columns times the layer's factors, rows divided where it feeds a smoothed layer."""
        out = weight.to(torch.float64)
        if name in self.columns:
            out = out * self.columns[name][None, :]
        if name in self.rows:
            out = out / self.rows[name][first_row : first_row + len(weight), None]
        return out.to(torch.float32)

    def tensor(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """A norm's weight or a bias as the smoothed model holds it (others unchanged)."""
        if name not in self.dense:
            return value
        return (value.to(torch.float64) / self.dense[name]).to(torch.float32)

    def apply(self, model: nn.Module) -> None:
        """Fold the factors into a float model's weights, in place (its outputs do not change but
        for float rounding)."""
        for name, module in _linears(model, (nn.Linear,)):
            if name in self.columns or name in self.rows:
                weight: torch.Tensor = module.weight  # type: ignore[assignment]
                module.weight = nn.Parameter(self.weight(name, weight.detach()), requires_grad=False)
        for name, param in model.named_parameters():
            if name in self.dense:
                param.data = self.tensor(name, param.detach())


def smooth_model(model: nn.Module, batches: Sequence[Sequence[int]]) -> Smoothing | None:
    """Measure and fold the smoothing of a float model in place (what it applied), or None if its
    layout is not one this module knows (left as it is)."""
    plan = Smoothing.plan(measure(model, batches), model.config)
    if plan is not None:
        plan.apply(model)  # (new weight tensors: an output layer tied to the embedding comes untied)
    return plan
