"""A decoder forward without transformers' per-call machinery, for the target and for drafters.

A drafter level is one forward of the 0.5B draft model over 1-4 rows, and its int8 GEMMs were
only about half of the call: transformers' generic decoder (mask and cache bookkeeping, rotary
tables rebuilt per call, GQA keys copied per query head, per-module hooks and output records)
cost almost as much as the weights, and a fifth of the target's one-row forward
(docs/benchmarks-history.md, "Less time between kernels"). `LeanDecoder` runs the same layers of a
Qwen2/Llama-style model directly: the rotary angles once per call, attention through wmark's
tree kernel (`attention.tree_attention`), and the session's cache updated as transformers does,
so the session code is unchanged.

Where every projection is one of wmark's int8 layers on the CPU (the int8 target; the embedded
drafter, 8- or 4-bit), a layer is six calls, not ~35 torch ops: each RMSNorm runs inside the
GEMM call that reads it (`RowInt8Linear.rms_forward`), silu(gate) * up inside the down
projection's (`swiglu_forward`), and one C call splits q/k/v into heads and applies the rotary
embedding (`_tree_attention.rotate`). Other layers (float drafters) run the same steps as torch
ops.

Every step is row-local: a row's numbers depend on its own input and the keys it sees, never on
how many rows share the forward. So the target runs it `exact` (every forward's rows through
the tree kernel; the prompt's prefill stays transformers' SDPA forward, the same for every
session), and a token decoded alone and the same token verified in a draft tree get the same
logits, bit for bit: the text cannot depend on the drafter. A drafter runs it with SDPA for
blocks of more than 32 rows (a prompt), whose rounding depends on the block's shape, which only
changes what it proposes. The numbers are not transformers' to the last bit (other rounding of
the norms and SiLU), so a seed's text differs from wmark versions that ran transformers' decoder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy
import torch
from torch import nn
from transformers import DynamicCache

from wmark.generator.cpu import _tree_attention
from wmark.generator.cpu.attention import tree_attention, visible_keys
from wmark.generator.cpu.rowwise import RMS_NORM, SWIGLU, RowInt8Linear, gemm_threads
from wmark.generator.cpu.thread_tuner import ThreadTuner
from wmark.generator.models.fused import stacked_layer
from wmark.generator.models.kv_cache import SlabLayer

__all__ = ["LeanDecoder", "lean_decoder"]

_LAYER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


Projection = Callable[[torch.Tensor], Sequence[torch.Tensor]]
_KERNEL_ROWS = 32  # forwards of at most this many rows attend through `tree_attention`


def _projection(members: list[Any]) -> Projection:
    """`members` (layers reading one input) as one call returning their outputs: a single GEMM
    where they are a fused int8 group."""
    stacked = stacked_layer(members)
    if stacked is None:
        return lambda h: [m(h) for m in members]
    sizes = [int(m.out_features) for m in members]
    return lambda h: torch.split(stacked(h), sizes, dim=-1)


class _Int8Layer:
    """A decoder layer's four int8 GEMMs (q/k/v and gate/up each one fused group) and its norms."""

    def __init__(self, layer: Any, qkv: RowInt8Linear, gate_up: RowInt8Linear) -> None:
        self.qkv, self.gate_up = qkv, gate_up
        self.o: RowInt8Linear = layer.self_attn.o_proj
        self.down: RowInt8Linear = layer.mlp.down_proj
        self.norm_in = layer.input_layernorm.weight.detach().to(torch.float32).contiguous()
        self.norm_post = layer.post_attention_layernorm.weight.detach().to(torch.float32).contiguous()
        self.norm_in_rows, self.norm_post_rows = self.norm_in.numpy(), self.norm_post.numpy()

    @staticmethod
    def of(layer: Any) -> _Int8Layer | None:
        """The layer's int8 parts, or None where one of them is another kind of layer."""
        attention, mlp = layer.self_attn, layer.mlp
        qkv = stacked_layer([attention.q_proj, attention.k_proj, attention.v_proj])
        gate_up = stacked_layer([mlp.gate_proj, mlp.up_proj])
        if qkv is None or gate_up is None:
            return None
        if not isinstance(attention.o_proj, RowInt8Linear) or not isinstance(mlp.down_proj, RowInt8Linear):
            return None
        return _Int8Layer(layer, qkv, gate_up)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanDecoder:
    """Calls a causal LM's decoder layers directly (see the module docstring).

    Args:
        model: a transformers causal LM whose decoder (`model.model`) has `embed_tokens`,
            `layers` (self_attn with q/k/v/o_proj, mlp with gate/up/down_proj and SiLU, two RMSNorms),
            `norm` and `rotary_emb`, as Qwen2 and Llama have. `lean_decoder` checks this.
        exact: every row attends through the tree kernel, however many rows a forward has, so that
            a row's numbers depend on that row alone (a target's forwards; the prompt's prefill
            does not run here). Otherwise forwards of more than 32 rows take SDPA (a drafter).
        tune_threads: int8 forwards of up to 32 rows run on the thread count measured fastest
            for their row count (`wmark.generator.cpu.thread_tuner`), not always on the plan's. For
            draft models (`build_drafter`): a small model's forward sits near the point where a
            second thread stops paying (it lost from one where torch's OpenMP threads spin). A
            target's never came near it, and probing it on one thread cost more than it could
            win (measured on summaries: docs/benchmarks-history.md, the thread tuner).
    """

    def __init__(self, model: Any, *, exact: bool = False, tune_threads: bool = False) -> None:
        self.exact = exact
        # transformers' modules type their attributes loosely (Tensor | Module): read them as Any.
        decoder: Any = model.model
        config: Any = model.config
        self.embed: nn.Module = decoder.embed_tokens
        self.layers: list[Any] = list(decoder.layers)
        self.norm: nn.Module = decoder.norm
        self.norm_weight = decoder.norm.weight.detach().to(torch.float32).contiguous()
        self._model = model  # its output layer is looked up per call: truncate_head may replace it
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.inv_freq: torch.Tensor = decoder.rotary_emb.inv_freq.to(torch.float32)
        self.rope_scale = float(getattr(decoder.rotary_emb, "attention_scaling", 1.0))
        self.scaling = self.head_dim**-0.5
        self.qkv = [_projection([a.q_proj, a.k_proj, a.v_proj]) for a in (la.self_attn for la in self.layers)]
        self.gate_up = [_projection([m.gate_proj, m.up_proj]) for m in (la.mlp for la in self.layers)]
        self.o = [_projection([la.self_attn.o_proj]) for la in self.layers]
        self.down = [_projection([la.mlp.down_proj]) for la in self.layers]
        parts = [_Int8Layer.of(layer) for layer in self.layers]
        int8 = [part for part in parts if part is not None]
        self.int8: list[_Int8Layer] | None = int8 if len(int8) == len(parts) else None
        self.tuner = ThreadTuner() if tune_threads and self.int8 is not None else None

    def _rms(self, x: torch.Tensor, norm: Any) -> torch.Tensor:
        return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, self.eps)

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """Logits (1, n, vocab) of the n input tokens; their keys and values join `cache`.

        `attention_mask`: (1, 1, n, cached + n) additive mask (0 where visible), as the session
        builds it; `position_ids`: (1, n).
        """
        # a drafter level (few rows) attends through wmark's tree kernel, the prompt (many rows)
        # through SDPA, whose blocked kernel wins there; an exact decoder always takes the kernel
        exact = self.exact or input_ids.shape[1] <= _KERNEL_ROWS
        with self.tuner.forward(input_ids.shape[1]) if self.tuner is not None else contextlib.nullcontext():
            x = self._layers(input_ids, attention_mask, position_ids, cache, exact)
            head = self._model.get_output_embeddings()
            if self.int8 is not None and isinstance(head, RowInt8Linear):
                logits: torch.Tensor = head.rms_forward(x, self.norm_weight, self.eps)
                return logits
            logits = head(self._rms(x, self.norm))
            return logits

    @torch.inference_mode()
    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> None:
        """The prompt's keys and values into `cache`, through SDPA, without logits (a session's
        prefill: a function of the prompt alone, so the same for every session).

        The last layer stops once its keys and values are cached: its attention output and MLP
        only feed the logits, which a prefill does not make (~1/L of the prefill's GEMMs).
        """
        self._layers(input_ids, attention_mask, position_ids, cache, exact=False, logits=False)

    def _layers(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
        exact: bool,
        logits: bool = True,
    ) -> torch.Tensor:
        """The hidden states after the last layer (before the final norm); `exact`: attention
        through the tree kernel, else SDPA. `logits` False: only the cache is wanted, so the
        last layer ends after its keys and values (the returned states are then the input of
        the last layer, of no use)."""
        x: torch.Tensor = self.embed(input_ids).to(torch.float32)
        visible = visible_keys(attention_mask) if exact else None
        angles = position_ids[0].to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos() * self.rope_scale, angles.sin() * self.rope_scale
        if self.int8 is not None and x.device.type == "cpu":
            return self._int8_layers(x, cos, sin, attention_mask, visible, cache, logits)
        n = x.shape[1]
        for index, layer in enumerate(self.layers):
            h = self._rms(x, layer.input_layernorm)
            q, k, v = self.qkv[index](h)
            q = q.reshape(1, n, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k, v = cache.update(k, v, index)
            if not logits and index == len(self.layers) - 1:
                break
            x = x + self.o[index](self._attend(q, k, v, attention_mask, visible))[0]
            h = self._rms(x, layer.post_attention_layernorm)
            gate, up = self.gate_up[index](h)
            x = x + self.down[index](nn.functional.silu(gate) * up)[0]
        return x

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor,
        visible: torch.Tensor | None,
    ) -> torch.Tensor:
        """(1, n, heads x d) attention output: the tree kernel where `visible` is given, else SDPA."""
        n = q.shape[2]
        if visible is not None:
            out = tree_attention(q, k, v, visible, self.scaling)  # (1, n, heads, d)
        else:
            out = nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attention_mask, scale=self.scaling, enable_gqa=True
            ).transpose(1, 2)
        return out.reshape(1, n, self.heads * self.head_dim)

    def _int8_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: torch.Tensor,
        visible: torch.Tensor | None,
        cache: DynamicCache,
        logits: bool,
    ) -> torch.Tensor:
        """`_layers` where every layer is int8 (`self.int8`): six kernel calls a layer."""
        assert self.int8 is not None
        n, d = x.shape[1], self.head_dim
        cos, sin = cos.contiguous(), sin.contiguous()
        if logits and visible is not None and all(isinstance(layer, SlabLayer) for layer in cache.layers):
            return self._kernel_layers(x, cos, sin, visible, cache)
        for index, layer in enumerate(self.int8):
            qkv = layer.qkv.rms_forward(x, layer.norm_in, self.eps)
            q = torch.empty(1, self.heads, n, d)
            k = torch.empty(1, self.kv_heads, n, d)
            v = torch.empty(1, self.kv_heads, n, d)
            _tree_attention.rotate(
                qkv.numpy(), cos.numpy(), sin.numpy(), q.numpy(), k.numpy(), v.numpy(),
                self.heads, self.kv_heads, n, d,
            )  # fmt: skip
            k, v = cache.update(k, v, index)
            if not logits and index == len(self.int8) - 1:
                break
            x = x + layer.o(self._attend(q, k, v, attention_mask, visible))
            x = x + layer.down.swiglu_forward(layer.gate_up.rms_forward(x, layer.norm_post, self.eps))
        return x

    def _kernel_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        visible: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """`_int8_layers` where every row attends through the tree kernel (a few-row forward):
        the same kernel calls on the same numbers, but on buffers made once per forward and
        passed as numpy arrays, with no torch op between them. The torch steps around the calls
        (reshapes, new tensors, views of the cache) cost a sixth of the target's one-row forward
        and more of the drafter's (docs/benchmarks-history.md, "Less time between kernels")."""
        assert self.int8 is not None
        n, d, threads = x.shape[1], self.head_dim, gemm_threads()
        first = self.int8[0]
        hidden = x.reshape(n, -1).contiguous().numpy()  # the residual stream, updated in place
        qkv = numpy.empty((n, first.qkv.out_features), dtype=numpy.float32)
        q = numpy.empty((self.heads, n, d), dtype=numpy.float32)
        k, v = torch.empty(1, self.kv_heads, n, d), torch.empty(1, self.kv_heads, n, d)
        k_rows, v_rows = k[0].numpy(), v[0].numpy()
        attended = numpy.empty((n, self.heads * d), dtype=numpy.float32)
        added = numpy.empty_like(hidden)
        gate_up = numpy.empty((n, first.gate_up.out_features), dtype=numpy.float32)
        cos_rows, sin_rows, seen = cos.numpy(), sin.numpy(), visible.numpy()
        for layer, slab in zip(self.int8, cache.layers, strict=True):
            layer.qkv.into(hidden, qkv, threads, RMS_NORM, layer.norm_in_rows, self.eps)
            _tree_attention.rotate(
                qkv, cos_rows, sin_rows, q, k_rows, v_rows, self.heads, self.kv_heads, n, d
            )
            keys, values, length = slab.append(k, v)
            _tree_attention.attend(
                q, keys, values, seen, attended, self.heads, self.kv_heads, n, length, d, self.scaling,
                keys.shape[1], threads,
            )  # fmt: skip
            layer.o.into(attended, added, threads)
            numpy.add(hidden, added, out=hidden)
            layer.gate_up.into(hidden, gate_up, threads, RMS_NORM, layer.norm_post_rows, self.eps)
            layer.down.into(gate_up, added, threads, SWIGLU)
            numpy.add(hidden, added, out=hidden)
        return torch.from_numpy(hidden).reshape(1, n, -1)


def lean_decoder(model: nn.Module, *, exact: bool = False, tune_threads: bool = False) -> LeanDecoder | None:
    """A `LeanDecoder` for `model` (`exact`, `tune_threads`: see the class), or None where its
    architecture is not the one it runs."""
    config = getattr(model, "config", None)
    decoder = getattr(model, "model", None)
    if config is None or decoder is None or getattr(config, "model_type", None) not in ("qwen2", "llama"):
        return None
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "use_sliding_window", False):
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default":
        return None
    layers = getattr(decoder, "layers", None)
    if not layers or not all(hasattr(layer, part) for layer in layers for part in _LAYER_PARTS):
        return None
    if not all(hasattr(layer.self_attn, p) for layer in layers for p in _ATTENTION_PARTS):
        return None
    if not all(hasattr(layer.mlp, p) for layer in layers for p in _MLP_PARTS):
        return None
    return LeanDecoder(model, exact=exact, tune_threads=tune_threads)
