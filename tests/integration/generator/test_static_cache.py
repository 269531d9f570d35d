"""The static-cache path (a cache allocated once, forwards padded to fixed shapes: what a GPU
replays as CUDA graphs) against the slab path, on tiny random models on the CPU.

With batch-invariant kernels (`exact-fp32`) a padded forward computes each real row as the slab
path does (the row kernel reads a row's visible keys only, in cache order; a GEMV per row), so
logits and tokens must be identical bit for bit, for every method. With stock kernels the
unpadded static path has the slab path's shapes exactly, so it too must be identical.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import BackendError
from wmark.generator.engine import METHODS, SamplerConfig, generate
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model
from wmark.generator.models.static_cache import FixedCache
from wmark.generator.models.static_forward import StaticPlan

VOCAB = 256  # the tiny models of conftest.py
EOS = frozenset({0})
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=VOCAB))
KEY = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny static").digest()), spec=SPEC)
PROMPT = [17, 42, 99, 3, 250, 7, 7, 128, 64, 5]
# small capacity and buckets: sessions outgrow the cache (it doubles mid-answer) and trees of
# more rows than the last bucket take the unpadded forward
SMALL = StaticPlan(capacity=16, buckets=(1, 2, 4, 8))


@pytest.fixture(scope="module")
def exact(tiny_qwen):
    """(slab, static) views of one exact-fp32 target and one drafter (the same weights)."""
    target = prepare_model(tiny_qwen(0), "exact-fp32", "cpu")
    drafter = prepare_model(tiny_qwen(2), "exact-fp32", "cpu")
    slab = (HFModel(target, EOS), HFModel(drafter, EOS))
    static = (HFModel(target, EOS, static=SMALL), HFModel(drafter, EOS, static=SMALL))
    return slab, static


def _generate(models, method: str, drafts: int) -> tuple:
    target, drafter = models
    config = SamplerConfig(method=method, drafts=drafts, lookahead=3, max_new_tokens=40)
    out = generate(target, PROMPT, config=config, key=KEY, drafter=drafter, seed=5)
    return out.token_ids, out.blocks


@pytest.fixture(scope="module")
def stock(tiny_qwen):
    """(slab, static unpadded) views of one fp32 target and drafter on stock kernels."""
    target = prepare_model(tiny_qwen(0), "fp32", "cpu")
    drafter = prepare_model(tiny_qwen(2), "fp32", "cpu")
    plan = StaticPlan(capacity=16, pad=False)
    slab = (HFModel(target, EOS), HFModel(drafter, EOS))
    return slab, (HFModel(target, EOS, static=plan), HFModel(drafter, EOS, static=plan))


@pytest.mark.parametrize("kernels", ["exact", "stock"])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_emits_the_same_tokens_and_blocks_on_the_static_cache(request, kernels, method):
    # exact-fp32: padded forwards; fp32 on stock kernels: unpadded ones (the slab path's shapes)
    slab, static = request.getfixturevalue(kernels)
    drafts = 4 if METHODS[method].multi_draft else 1
    tokens, blocks = _generate(slab, method, drafts)
    assert _generate(static, method, drafts) == (tokens, blocks)
    assert len(tokens) == 40 or tokens[-1] == 0


def _replay(model: HFModel, seed: int) -> list[torch.Tensor]:
    """Every logits row a session returns over a scripted run: random trees (some grown by a
    second extend before the accept), random accepted paths, extra tokens queued or not."""
    rng = np.random.default_rng(seed)
    session = model.session([int(t) for t in rng.integers(1, VOCAB, size=int(rng.integers(1, 30)))])
    rows: list[torch.Tensor] = []
    for _ in range(12):
        parents: list[int] = []
        for _ in range(int(rng.integers(0, 13))):
            parents.append(int(rng.integers(-1, len(parents))) if parents else -1)
        root, nodes = session.extend(parents, [int(t) for t in rng.integers(1, VOCAB, size=len(parents))])
        rows += [root, nodes]
        if parents and rng.random() < 0.3:  # a second level before the accept
            more = [int(rng.integers(0, len(parents)))]
            _, deeper = session.extend(more, [int(rng.integers(1, VOCAB))])
            rows.append(deeper)
            parents += more
        path: list[int] = []
        children = [i for i, p in enumerate(parents) if p == -1]
        while children and rng.random() < 0.8:
            path.append(int(rng.choice(children)))
            children = [i for i, p in enumerate(parents) if p == path[-1]]
        extra = [int(rng.integers(1, VOCAB))] if rng.random() < 0.7 or not path else []
        session.accept(path, extra)
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_padded_forwards_give_the_slab_paths_logits_bit_for_bit_with_exact_kernels(exact, seed):
    (slab, _), (static, _) = exact
    assert all(torch.equal(a, b) for a, b in zip(_replay(slab, seed), _replay(static, seed), strict=True))


def test_unpadded_forwards_give_the_slab_paths_logits_bit_for_bit_with_stock_kernels(tiny_qwen):
    model = prepare_model(tiny_qwen(0), "fp32", "cpu")
    slab = HFModel(model, EOS)
    static = HFModel(model, EOS, static=StaticPlan(capacity=16, pad=False))
    for seed in range(3):
        assert all(torch.equal(a, b) for a, b in zip(_replay(slab, seed), _replay(static, seed), strict=True))


def test_padded_forwards_with_stock_kernels_stay_within_float_rounding(tiny_qwen):
    # stock SDPA and GEMMs round by shape, so padding rows and reading the whole capacity may
    # change the last bits, not more: float32 rounding through two layers is ~1e-6 of the logits'
    # scale; 1e-4 leaves a wide margin and still fails a wrong mask, slot or position (O(scale))
    model = prepare_model(tiny_qwen(0), "fp32", "cpu")
    slab, static = HFModel(model, EOS), HFModel(model, EOS, static=SMALL)
    for seed in range(3):
        for a, b in zip(_replay(slab, seed), _replay(static, seed), strict=True):
            assert a.shape == b.shape
            if a.numel():
                assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max())


def test_the_comparisons_cover_padding_the_unpadded_fallback_and_growth(exact, monkeypatch):
    # the scripted runs above must exercise what differs from the slab path: forwards padded
    # to a bucket (some with padding rows), trees past the last bucket, and a cache that grows
    from wmark.generator.models.static_forward import StaticStore

    (slab, _), _ = exact
    model = HFModel(slab.model, EOS, static=SMALL)
    calls: list[tuple[str, int, int]] = []
    padded, unpadded = StaticStore._padded, StaticStore._exact
    monkeypatch.setattr(
        StaticStore,
        "_padded",
        lambda self, bucket, inputs, *a: (
            calls.append(("padded", bucket.rows, len(inputs))) or padded(self, bucket, inputs, *a)
        ),
    )
    monkeypatch.setattr(
        StaticStore,
        "_exact",
        lambda self, inputs, *a: calls.append(("exact", 0, len(inputs))) or unpadded(self, inputs, *a),
    )
    for seed in range(4):
        _replay(model, seed)
    assert any(kind == "padded" and rows > n for kind, rows, n in calls)  # padding rows
    assert any(kind == "exact" and n > SMALL.buckets[-1] for kind, _, n in calls)
    assert any(store.text_rows > SMALL.capacity for store in model.static_stores)  # it grew


def test_live_sessions_get_their_own_stores_and_a_dropped_sessions_store_is_reused(exact):
    _, (static, _) = exact
    first = static.session([5, 6, 7])
    first.extend([], [])
    second = static.session([8, 9])  # the first is alive: a store of its own
    assert first.store.store is not second.store.store
    stores = len(static.static_stores)
    reference = HFModel(static.model, EOS).session([5, 6, 7])
    assert torch.equal(first.extend([-1], [4])[1], reference.extend([-1], [4])[1])  # undisturbed
    first_store = first.store.store
    del first
    third = static.session([1, 2])
    assert third.store.store is first_store and len(static.static_stores) == stores
    lease = first_store.lease()  # taken over: the third session's lease is refused
    assert lease is not None
    with pytest.raises(BackendError, match="one session at a time"):
        third.extend([], [])


def test_a_model_drafting_for_itself_runs_on_the_static_cache(exact):
    (slab, _), (static, _) = exact
    config = SamplerConfig(method="mpfr", drafts=2, lookahead=3, max_new_tokens=24)
    want = generate(slab, PROMPT, config=config, key=KEY, drafter=slab, seed=1).token_ids
    assert generate(static, PROMPT, config=config, key=KEY, drafter=static, seed=1).token_ids == want


def test_the_cache_grows_keeping_its_rows(exact):
    _, (static, _) = exact
    session = static.session(list(range(1, 40)))  # a prompt past the 16-row capacity
    store = session.store.store
    session.extend([-1, 0], [3, 4])
    assert store.text_rows >= 41 and store.cache.capacity == store.text_rows + store.scratch
    assert store.cache.length == 41


def test_plans_and_caches_refuse_what_they_cannot_serve(tiny_qwen):
    with pytest.raises(ValueError, match="ascending"):
        StaticPlan(buckets=(4, 2))
    with pytest.raises(ValueError, match="pad=True"):
        StaticPlan(pad=False, graphs=True)
    with pytest.raises(ValueError, match="capacity"):
        StaticPlan(capacity=0)
    model = prepare_model(tiny_qwen(0), "fp32", "cpu")
    with pytest.raises(BackendError, match="CUDA graphs need a CUDA model"):
        HFModel(model, EOS, static=StaticPlan(graphs=True))
    config = model.config.__class__(**{**model.config.to_dict(), "layer_types": ["sliding_attention"] * 2})
    with pytest.raises(BackendError, match="full-attention layers only"):
        FixedCache.for_config(config, 8, torch.float32, torch.device("cpu"))


def test_cuda_models_load_onto_the_static_cache_with_graphs_unless_switched_off(monkeypatch):
    from wmark.generator.models.loading import static_plan

    assert static_plan("cpu") is None  # the CPU keeps each session's slab
    assert static_plan("cuda") == StaticPlan(graphs=True)
    monkeypatch.setenv("WMARK_CUDA_GRAPHS", "0")
    assert static_plan("cuda") is None
