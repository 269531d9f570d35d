"""The lean decoder (generator/models/lean_decoder.py) computes what transformers' decoder
computes, on tree-shaped blocks over a growing cache, and a drafter running it keeps the text."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.generator.cpu.rowwise import RowInt8Linear
from wmark.generator.drafters.build import build_drafter
from wmark.generator.drafters.hybrid import HybridDrafter
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.models import kv_cache, session_store
from wmark.generator.models.fused import FusedGroup, _Slice, stack, stacked_layer
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.kv_cache import session_cache
from wmark.generator.models.lean_decoder import LeanDecoder, lean_decoder
from wmark.generator.models.prepare import prepare_model

EOS = frozenset({0})
PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17, 42, 99]
TREE_PARENTS = [-1, -1, 0, 1, 2, 2, 4]  # two branches, one forking: rows see different keys
TREE_TOKENS = [5, 9, 77, 31, 8, 200, 1]
KEY = KeyMaterial(
    key_id="wk_tiny",
    secret=Secret(hashlib.sha256(b"tiny key").digest()),
    spec=WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=256)),
)


def _blocks(model: HFModel) -> torch.Tensor:
    """Logits of a prompt, a tree over it, then (a path of it accepted and the cache pruned) a
    second tree after a queued token: every kind of block a drafter level runs."""
    session = model.session(PROMPT)
    root, nodes = session.extend(TREE_PARENTS, TREE_TOKENS)
    session.accept([0, 2], [13])
    root2, nodes2 = session.extend([-1, 0], [11, 12])
    return torch.cat([root[None], nodes, root2[None], nodes2])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_lean_forward_matches_the_transformers_forward(tiny_qwen, precision):
    stock = HFModel(prepare_model(tiny_qwen(3), precision, "cpu"), EOS)
    stock.plan = dataclasses.replace(stock.plan, rows_exact=False, decoder=None)  # SDPA, transformers'

    lean = copy.deepcopy(stock)
    decoder = lean_decoder(lean.model)
    lean.plan = dataclasses.replace(lean.plan, decoder=decoder)
    assert isinstance(decoder, LeanDecoder)
    assert (decoder.int8 is not None) == (precision == "int8")  # int8 layers: the fused path
    fused = decoder.int8
    decoder.int8 = None  # first the same torch operations as transformers
    expected, got = _blocks(stock), _blocks(lean)
    # The same operations (equal to the bit on this torch build); the tolerance leaves room for
    # another build's kernels ordering a sum differently: 1e-5 of the logits' range, where a wrong
    # rotary, mask or GQA mapping moves logits by a sizeable part of that range.
    tolerance = 1e-5 * float(expected.max() - expected.min())
    assert torch.allclose(got, expected, rtol=0, atol=tolerance)
    if fused is not None:
        # The fused path (norms and SwiGLU inside the GEMM calls, the rotary in C) rounds its
        # float steps differently, and the int8 quantisation of a layer's input absorbs nearly all
        # of that: it may move the logits by no more than quantising moved them from float32's
        # (a wrong norm, rotary or head split would move them by a sizeable part of the range).
        decoder.int8 = fused
        float32 = _blocks(HFModel(prepare_model(tiny_qwen(3), "fp32", "cpu"), EOS))
        noise = float((expected - float32).abs().max())
        assert float((_blocks(lean) - got).abs().max()) <= noise


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_prefill_caches_what_a_full_forward_caches(tiny_qwen, precision):
    # The prefill ends the last layer once its keys and values are cached; every layer's keys and
    # values must still be those of a full forward, bit for bit (the same operations, fewer after).
    model = HFModel(prepare_model(tiny_qwen(3), precision, "cpu"), EOS)
    lean = lean_decoder(model.model)
    assert lean is not None and (lean.int8 is not None) == (precision == "int8")
    ids = torch.tensor([PROMPT * 4])  # 48 rows: past the tree kernel's, the prefill's SDPA path
    n = ids.shape[1]
    mask = torch.zeros(1, 1, n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)
    positions = torch.arange(n)[None]
    full, prefilled = session_cache(model.model.config), session_cache(model.model.config)
    lean(ids, mask, positions, full)
    lean.prefill(ids, mask, positions, prefilled)
    assert len(full.layers) == len(prefilled.layers) == 2
    for a, b in zip(full.layers, prefilled.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_the_kernel_loop_gives_the_per_layer_loops_bits(tiny_qwen, monkeypatch):
    # An int8 model's few-row forwards over wmark's own cache run `_kernel_layers` (buffers made
    # once per forward, bare kernel calls); over transformers' cache they take the per-layer
    # torch loop, the reference here. The same kernels on the same numbers: the logits must be
    # equal to the bit, through buffer growth (ROOM cut to 2 rows so the buffers grow mid-run)
    # and the accepted path's moves.
    monkeypatch.setattr(kv_cache, "ROOM", 2)
    model = HFModel(prepare_model(tiny_qwen(3), "int8", "cpu"), EOS)
    assert model.plan.decoder is not None and model.plan.decoder.int8 is not None  # the target's plan
    loops = []
    kernel_layers = LeanDecoder._kernel_layers
    monkeypatch.setattr(
        LeanDecoder, "_kernel_layers", lambda self, *args: loops.append(1) or kernel_layers(self, *args)
    )
    fast = _blocks(model)
    assert len(loops) == 2  # both tree blocks (the prompt's prefill takes SDPA)
    monkeypatch.setattr(session_store, "session_cache", lambda config: DynamicCache(config=config))
    reference = _blocks(model)
    assert len(loops) == 2
    assert torch.equal(fast, reference)


def test_lean_forward_uses_the_fused_int8_groups(tiny_qwen):
    model = prepare_model(tiny_qwen(3), "int8", "cpu")
    attention = model.model.layers[0].self_attn
    assert stacked_layer([attention.q_proj, attention.k_proj, attention.v_proj]) is not None
    assert stacked_layer([attention.k_proj, attention.q_proj, attention.v_proj]) is None  # order
    assert stacked_layer([attention.q_proj, attention.k_proj]) is None  # part of a group
    assert stacked_layer([attention.o_proj]) is None  # not fused
    assert stacked_layer([]) is None


def test_stacked_layer_is_the_group_linear():
    gen = torch.Generator().manual_seed(0)
    layers = [
        RowInt8Linear(torch.randint(-127, 128, (n, 16), generator=gen, dtype=torch.int8), torch.rand(n), None)
        for n in (8, 4)
    ]
    group = FusedGroup(stack(layers), 2)
    first, second = _Slice(group, 0, 8, 16), _Slice(group, 8, 12, 16)
    stacked = stacked_layer([first, second])
    assert stacked is group.linear
    x = torch.randn(3, 16, generator=gen)
    assert torch.equal(stacked(x), torch.cat([first(x), second(x)], dim=-1))
    other = _Slice(FusedGroup(stack(layers), 2), 8, 12, 16)
    assert stacked_layer([first, other]) is None  # slices of two different groups


def _qwen(**overrides) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, **overrides,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_lean_decoder_declines_what_it_does_not_run():
    assert isinstance(lean_decoder(_qwen()), LeanDecoder)
    assert lean_decoder(_qwen(hidden_act="gelu")) is None
    assert lean_decoder(_qwen(use_sliding_window=True, sliding_window=8)) is None
    scaled = _qwen(rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert lean_decoder(scaled) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert lean_decoder(gpt2) is None
    assert lean_decoder(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize("precision", ["exact-fp32", "int8"])
def test_a_lean_drafter_keeps_the_text(tiny_qwen, precision):
    base = tiny_qwen(3)
    target = HFModel(prepare_model(copy.deepcopy(base), precision, "cpu"), EOS)
    noisy = copy.deepcopy(base)  # the target's weights with noise: drafts well, not perfectly
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.02 * param.std())
    own = HFModel(prepare_model(noisy, precision, "cpu"), EOS)
    drafter = build_drafter("auto", target, own)  # the CLI's path: the hybrid over a lean model
    assert isinstance(drafter, HybridDrafter) and isinstance(own.plan.decoder, LeanDecoder)

    def run(method: str, draft, drafts: int | None = None):
        config = SamplerConfig(method=method, drafts=drafts, lookahead=4, max_new_tokens=40)
        return generate(target, PROMPT, config=config, key=KEY, drafter=draft, seed=5)

    reference = run("basic-uwm", None)
    out = run("mpfr", drafter, 3)
    assert out.token_ids == reference.token_ids
    assert out.draft_forwards > 0 and out.aatps > 1.0  # the lean model really drafted, and well


def test_an_int8_target_runs_exact_and_each_tree_row_gets_its_logits_alone(tiny_qwen):
    """The int8 target's forwards run the lean decoder in exact mode: in a 40-row tree (past the
    32 rows where a drafter's forward switches to SDPA) each row's logits equal, bit for bit,
    those of its path decoded one token at a time."""
    target = HFModel(prepare_model(tiny_qwen(3), "int8", "cpu"), EOS)
    decoder = target.plan.decoder
    assert target.plan.rows_exact and decoder is not None and decoder.exact and decoder.int8 is not None
    chain = [(i - 1, 10 + i) for i in range(20)]  # nodes 0-19: one path of 20 tokens
    siblings = [(-1, 100 + i) for i in range(20)]  # nodes 20-39: 20 one-token drafts
    parents, tokens = zip(*(chain + siblings), strict=True)
    root, nodes = target.session(PROMPT).extend(list(parents), list(tokens))
    assert nodes.shape[0] == 40

    def alone(path: list[int]) -> torch.Tensor:
        session = target.session(PROMPT)
        logits, _ = session.extend([], [])
        for token in path:
            _, rows = session.extend([-1], [token])
            session.accept([0], [])
            logits = rows[0]
        return logits

    assert torch.equal(root, alone([]))
    assert torch.equal(nodes[19], alone([t for _, t in chain]))  # the deepest node
    assert torch.equal(nodes[4], alone([t for _, t in chain[:5]]))
    for node in (20, 39):
        assert torch.equal(nodes[node], alone([tokens[node]]))


def test_a_drafter_tunes_its_thread_count_and_its_logits_do_not_move(tiny_qwen, monkeypatch):
    """build_drafter gives a draft model's lean decoder a thread tuner (the target's has none),
    and the forwards it runs on one thread or on two give the same bits."""
    target = HFModel(prepare_model(tiny_qwen(3), "int8", "cpu"), EOS, gemm_threads=2)
    own = HFModel(prepare_model(tiny_qwen(4), "int8", "cpu"), EOS, gemm_threads=2)
    drafter = build_drafter("embedded", target, own)
    assert isinstance(drafter, HFModel) and drafter.plan.gemm_threads == 2  # the thread plan's count
    decoder = drafter.plan.decoder
    assert decoder is not None and decoder.tuner is not None
    assert lean_decoder(target.model, exact=True).tuner is None  # type: ignore[union-attr]
    runs = [_blocks(drafter) for _ in range(4)]  # every bucket probed on one thread and on two
    assert all(torch.equal(run, runs[0]) for run in runs)
    chosen = decoder.tuner.chosen()
    assert set(chosen) == {4, 8} and set(chosen.values()) <= {1, 2}  # a 7-row tree, then 1 + 2 rows
