"""A drafter output layer over part of the vocabulary: a cheaper drafter forward, the same text.

The 0.5B drafter's vocabulary projection (151,936 x 896) is a quarter of its weights, and on a
CPU a drafter forward is paid per weight read. A byte-level BPE vocabulary numbers its tokens in
merge order, so the low IDs are the common ones: keeping the first `keep` rows (plus the EOS
tokens) drops the rarely drafted tail. The other tokens get logit -inf, so the drafter never
proposes them; the target still verifies and emits every token, so the text is unchanged (the
drafter only proposes) and only blocks that needed a rare token get shorter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from wmark.generator.cpu.rowwise import RowFloatLinear, RowInt8Linear
from wmark.generator.models.hf_session import HFModel

__all__ = ["DRAFT_VOCAB", "TruncatedHead", "truncate_head"]

DRAFT_VOCAB = 32768  # Qwen2.5: IDs below 32k are 94% of the tokens of the built-in prompt sets


def _rows(layer: nn.Module, keep: torch.Tensor) -> nn.Module:
    """`layer` (a vocabulary projection) restricted to the output rows `keep`."""
    if isinstance(layer, RowInt8Linear):
        weight, scale = layer.int8_weight()
        weight, scale = weight.index_select(0, keep), scale.index_select(0, keep)
        bias = None if layer.bias is None else layer.bias.index_select(0, keep)
        cut = RowInt8Linear(weight, scale, bias, layer.scale_cols)
        cut.pack()
        return cut
    if isinstance(layer, RowFloatLinear | nn.Linear):
        weight = layer.weight.detach().index_select(0, keep)
        bias = None if layer.bias is None else layer.bias.detach().index_select(0, keep)
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias, requires_grad=False)
        return RowFloatLinear(linear) if isinstance(layer, RowFloatLinear) else linear.to(weight.device)
    raise TypeError(f"cannot truncate an output layer of type {type(layer).__name__}")


class TruncatedHead(nn.Module):
    """The projection onto the kept rows, scattered into a full-width row of -inf."""

    def __init__(self, layer: nn.Module, keep: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.inner = _rows(layer, keep)
        self.keep: torch.Tensor = keep
        self.vocab_size = vocab_size
        # the kept IDs start with a run 0, 1, ..., run - 1 (the common tokens): a slice copy,
        # cheaper than scattering all of them (BENCHMARKS.md, "Kernels")
        ids = keep.tolist()
        self.run = next((i for i, token in enumerate(ids) if token != i), len(ids))
        self.rest: torch.Tensor = keep[self.run :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part: torch.Tensor = self.inner(x)
        out = part.new_full((*part.shape[:-1], self.vocab_size), -math.inf)
        out[..., : self.run] = part[..., : self.run]
        out[..., self.rest] = part[..., self.run :]
        return out


def truncate_head(model: HFModel, keep: int = DRAFT_VOCAB, always: Iterable[int] = ()) -> HFModel:
    """Give `model` (a drafter, modified in place) an output layer over IDs < `keep` plus `always`.

    Returns the model; a vocabulary no larger than `keep` is left as it is.
    """
    if keep >= model.vocab_size:
        return model
    extra = sorted({int(t) for t in always} | set(model.eos_token_ids))
    ids = torch.tensor(sorted(set(range(keep)) | {t for t in extra if 0 <= t < model.vocab_size}))
    head = model.model.get_output_embeddings()
    if head is None:
        raise TypeError("the model has no output layer to truncate")
    model.model.set_output_embeddings(TruncatedHead(head, ids.to(model.device), model.vocab_size))
    return model
