"""The cheap drafters on tiny random transformers: prompt lookup, the hybrid, the truncated output
layer and dynamic lookahead all leave the text exactly basic-uwm's (drafter invariance), and
each does draft (a drafter that never proposed would pass invariance trivially)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import numpy as np
import pytest
import torch

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.errors import InputError
from wmark.generator.drafters.build import build_drafter, drafter_model_source
from wmark.generator.drafters.hybrid import (
    MODEL_CONTEXT,
    PRIOR_RATE,
    PRIOR_WEIGHT,
    HybridDrafter,
    Rate,
    ShortMatchRule,
)
from wmark.generator.drafters.prompt_lookup import PromptLookup, SuffixIndex, lookup_trust
from wmark.generator.drafters.truncated_head import TruncatedHead, truncate_head
from wmark.generator.engine import SamplerConfig, generate
from wmark.generator.fakes import FakeLM
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.prepare import prepare_model

VOCAB = 256  # the tiny models of conftest.py
EOS = 0
SPEC = WatermarkSpec(tokenizer=TokenizerRef(name="tiny", sha256="1" * 64, vocab_size=VOCAB))
KEY = KeyMaterial(key_id="wk_tiny", secret=Secret(hashlib.sha256(b"tiny key").digest()), spec=SPEC)
# A prompt that repeats itself, as a text to summarise or code to edit does: lookup finds matches.
PROMPT = [17, 42, 99, 3, 250, 7, 128, 64, 5, 17, 42, 99, 3, 250, 9, 31, 17, 42]
MAX_NEW = 40


@pytest.fixture(scope="module")
def models(tiny_trio) -> dict[str, HFModel]:
    return tiny_trio()


@pytest.fixture(scope="module")
def truncated(tiny_trio) -> HFModel:
    """The close drafter with its output layer cut to IDs < 128 (plus EOS)."""
    return truncate_head(tiny_trio()["close"], keep=128)


def _run(target, drafter, method="mpfr", drafts=4, lookahead=4, confidence=0.0, max_new=MAX_NEW, lookup=0):
    config = SamplerConfig(
        method=method,
        drafts=drafts,
        lookahead=lookahead,
        max_new_tokens=max_new,
        draft_confidence=confidence,
        lookup_lookahead=lookup,
    )
    return generate(target, PROMPT, config=config, key=KEY, drafter=drafter, seed=5)


def _drafters(models, truncated):
    stock = copy.deepcopy(models["close"])
    stock.plan = dataclasses.replace(stock.plan, rows_exact=False, decoder=None)  # stock SDPA attention
    return {
        "ngram": PromptLookup(VOCAB, frozenset({EOS})),
        "ngram-1": PromptLookup(VOCAB, frozenset({EOS}), min_match=1),
        "hybrid-close": HybridDrafter(models["close"]),
        "hybrid-close-last-4": HybridDrafter(models["close"], context=4),  # the model reads 4 prompt tokens
        "hybrid-unrelated": HybridDrafter(models["unrelated"]),
        "truncated-close": truncated,
        "hybrid-truncated": HybridDrafter(truncated),
        "close-stock-attention": stock,
    }


SETTINGS = [
    ("pfr", 1, 4, 0.0, 0),
    ("mpfr", 2, 3, 0.0, 0),
    ("mpfr", 4, 4, 0.0, 0),
    ("mpfr", 4, 6, 0.3, 0),
    ("pfr", 1, 8, 0.5, 0),
    ("mpfr", 2, 2, 0.3, 9),  # lookup drafts go on past L = 2
    ("pfr", 1, 1, 0.0, 12),
]


@pytest.mark.parametrize(
    "method,drafts,lookahead,confidence,lookup",
    SETTINGS,
    ids=[f"{m}-B{b}-L{ell}-c{c}-lookup{k}" for m, b, ell, c, k in SETTINGS],
)
def test_every_new_drafter_emits_basic_uwm_tokens(
    models, truncated, method, drafts, lookahead, confidence, lookup
):
    reference = _run(models["target"], None, method="basic-uwm", drafts=None)
    boundaries = {reference.blocks}
    for name, drafter in _drafters(models, truncated).items():
        out = _run(models["target"], drafter, method, drafts, lookahead, confidence, lookup=lookup)
        assert out.token_ids == reference.token_ids, name
        assert out.masked_positions == reference.masked_positions, name
        assert out.target_forwards == len(out.blocks), name  # still one target forward per block
        assert out.draft_forwards <= lookahead * len(out.blocks), name
        assert sum(out.drafted) > 0, name  # it proposed something
        boundaries.add(out.blocks)
    assert len(boundaries) > 2  # the drafters really differ in where blocks end


def _repetitive_pair() -> tuple[FakeLM, FakeLM, KeyMaterial]:
    """A low-entropy Markov target and drafter over 12 tokens (text that repeats itself, as
    summaries and code do, so prompt lookup has matches), and a key for them (seeded)."""
    rng = np.random.default_rng(0)
    target = FakeLM.markov(rng.dirichlet(np.full(12, 0.15), size=12))
    model = FakeLM.markov(rng.dirichlet(np.full(12, 0.15), size=12))
    spec = WatermarkSpec(tokenizer=TokenizerRef(name="fake", sha256="2" * 64, vocab_size=12))
    return target, model, KeyMaterial(key_id="k", secret=Secret(b"m" * 32), spec=spec)


def test_prompt_lookup_costs_no_forward_and_the_hybrid_fewer():
    target, model, key = _repetitive_pair()
    config = SamplerConfig(method="mpfr", drafts=2, lookahead=4, max_new_tokens=120)

    def run(drafter):
        return generate(target, [1, 2, 3, 4, 5, 6], config=config, key=key, drafter=drafter, seed=3)

    lookup, model_only, hybrid = (
        run(PromptLookup(12, frozenset(), min_match=1)),
        run(model),
        run(HybridDrafter(model)),
    )
    assert lookup.token_ids == model_only.token_ids == hybrid.token_ids
    assert lookup.draft_forwards == 0 and lookup.aatps > 1.5
    assert 0 < hybrid.draft_forwards < model_only.draft_forwards  # lookup drafted some levels for free


def test_lookup_drafts_go_past_lookahead_for_free():
    # The repetitive Markov text of `_repetitive_pair`: lookup matches run long, so past L = 2 the
    # blocks keep accepting lookup drafts, at no drafter forward beyond the L levels.
    target, model, key = _repetitive_pair()

    def run(drafter, lookup):
        config = SamplerConfig(
            method="mpfr", drafts=2, lookahead=2, max_new_tokens=120, lookup_lookahead=lookup
        )
        return generate(target, [1, 2, 3, 4, 5, 6], config=config, key=key, drafter=drafter, seed=3)

    for make in (
        lambda: PromptLookup(12, frozenset(), min_match=1),
        lambda: HybridDrafter(model, min_match=1),
    ):
        fixed, deep = run(make(), 0), run(make(), 10)
        assert deep.token_ids == fixed.token_ids
        assert max(fixed.blocks) <= 3 < max(deep.blocks)  # L + 1 at most without; longer with
        assert len(deep.blocks) < len(fixed.blocks)  # fewer target forwards for the same text
        assert deep.draft_forwards <= 2 * len(deep.blocks)  # the extra levels ran no drafter forward


def test_dynamic_lookahead_cuts_drafter_forwards(models):
    full = _run(models["target"], models["unrelated"], "pfr", 1, 6)
    dynamic = _run(models["target"], models["unrelated"], "pfr", 1, 6, confidence=0.5)
    assert dynamic.token_ids == full.token_ids
    assert dynamic.draft_forwards < full.draft_forwards
    assert sum(dynamic.drafted) < sum(full.drafted)


def test_truncated_head_never_proposes_a_dropped_token(tiny_trio):
    base = tiny_trio()["close"]
    cut = truncate_head(copy.deepcopy(base), keep=100, always=[200])
    full_root, _ = base.session(PROMPT).extend([], [])
    cut_root, _ = cut.session(PROMPT).extend([], [])
    kept = [*range(100), 200, EOS]
    # same logits on the kept tokens, up to float32 rounding: a GEMM over fewer output rows may
    # block (so sum) the hidden dimension differently; a few ulps of the logits' scale
    assert torch.allclose(cut_root[kept], full_root[kept], rtol=1e-6, atol=1e-6)
    dropped = sorted(set(range(VOCAB)) - set(kept))
    assert bool(cut_root[dropped].isneginf().all())


def test_truncated_head_on_the_int8_path(tiny_qwen):
    model = HFModel(prepare_model(tiny_qwen(2), "int8", "cpu"), frozenset({EOS}))
    full_root, _ = model.session(PROMPT).extend([], [])
    truncate_head(model, keep=64)
    assert isinstance(model.model.get_output_embeddings(), TruncatedHead)
    cut_root, _ = model.session(PROMPT).extend([], [])
    assert bool((cut_root[:64] == full_root[:64]).all())  # the int8 rows are the same rows
    assert bool(cut_root[64:].isneginf().all())


def test_drafter_names_resolve_to_what_they_say(models):
    assert drafter_model_source("ngram", "embedded") is None
    assert drafter_model_source("auto", "embedded") == "embedded"
    assert drafter_model_source("auto", "/some/model") is None  # no known drafter for another target
    assert drafter_model_source("/some/drafter", "embedded") == "/some/drafter"
    target = models["target"]
    assert isinstance(build_drafter("ngram", target, None), PromptLookup)
    assert isinstance(build_drafter("auto", target, None), PromptLookup)
    hybrid = build_drafter("auto", target, copy.deepcopy(models["close"]))
    assert isinstance(hybrid, HybridDrafter)
    assert hybrid.model.plan.rows_exact is False  # a draft model attends with stock SDPA
    assert hybrid.context == MODEL_CONTEXT  # on a CPU it reads the prompt's tail
    on_gpu = FakeLM(VOCAB, lambda _context: np.zeros(VOCAB))
    on_gpu.device = torch.device("meta")  # as an HFModel on a GPU reports it
    assert build_drafter("auto", target, on_gpu).context is None  # prefill is cheap there: all of it
    own = copy.deepcopy(models["close"])
    assert build_drafter("/some/drafter", target, own) is own  # used as it is
    assert build_drafter("/some/drafter", target, target) is target
    assert target.plan.rows_exact  # the target drafting for itself keeps its batch-invariant attention
    with pytest.raises(ValueError):
        build_drafter("embedded", target, None)


@pytest.mark.parametrize("min_reach,max_rows", [(0.2, 0), (0.0, 3), (0.3, 4)])
def test_priced_rows_keep_the_text_and_prune_the_tree(models, truncated, min_reach, max_rows):
    reference = _run(models["target"], None, method="basic-uwm", drafts=None)
    for name, drafter in _drafters(models, truncated).items():
        config = SamplerConfig(
            method="mpfr",
            drafts=4,
            lookahead=4,
            max_new_tokens=MAX_NEW,
            min_reach=min_reach,
            max_rows=max_rows,
        )
        full = _run(models["target"], drafter, "mpfr", 4, 4)
        out = generate(models["target"], PROMPT, config=config, key=KEY, drafter=drafter, seed=5)
        assert out.token_ids == reference.token_ids, name
        if max_rows:
            assert max(out.drafted) <= max_rows, name
        assert sum(out.drafted) < sum(full.drafted), name  # it really pruned drafts


def test_lookup_rows_carry_their_measured_trust():
    index = SuffixIndex([1, 2, 3, 9, 1, 2, 3, 7, 5, 6, 4, 5, 6], min_match=2)
    row, trust = index.row([4, 5, 6, 1, 2, 3], VOCAB)  # "1 2 3" matched, then 9 or 7: two successors
    assert trust == lookup_trust(3, 2) == pytest.approx(0.7 * 0.6)
    assert sorted(torch.nonzero(row.isfinite()).flatten().tolist()) == [7, 9]
    _, short = index.row([9, 5, 6], VOCAB)  # "5 6" once before, then 4
    assert short == lookup_trust(2, 1) == 0.45
    empty, none = index.row([8, 8], VOCAB)
    assert none == 0.0 and bool(empty.isneginf().all())
    session = PromptLookup(VOCAB, frozenset({EOS})).session([1, 2, 3, 9, 1, 2, 3])
    session.extend([], [])
    assert session.row_trust() == [lookup_trust(3, 1)]  # the root: "1 2 3" -> 9 only
    session.extend([-1], [9])
    assert session.row_trust() == [lookup_trust(3, 1), lookup_trust(4, 1)]


def test_row_prices_are_checked():
    with pytest.raises(InputError, match="min_reach"):
        SamplerConfig(min_reach=1.0)
    with pytest.raises(InputError, match="max_rows"):
        SamplerConfig(max_rows=-1)


def test_prefill_runs_apart_and_changes_nothing(models):
    """`prefill()` processes the prompt before the first block (its seconds are `Timings.prefill`,
    not the first block's draft or verify) and leaves every logit as the lazy prefill gives it."""
    target = models["target"]
    eager = target.session(PROMPT)
    eager.prefill()
    eager.prefill()  # a second call is a no-op
    assert eager.prefilled and eager.forwards == 0  # the prompt is not a forward that made logits
    lazy = target.session(PROMPT)
    assert torch.equal(eager.extend([], [])[0], lazy.extend([], [])[0])

    hybrid = HybridDrafter(models["close"]).session(PROMPT)
    hybrid.prefill()
    assert hybrid.model.prefilled

    result = _run(target, HybridDrafter(models["close"]))
    t = result.timings
    assert t.prefill > 0.0
    assert t.total == pytest.approx(t.prefill + t.decode)
    fake = _run(FakeLM.fixed(np.full(VOCAB, 1 / VOCAB)), PromptLookup(VOCAB, frozenset({EOS})))
    assert fake.timings.prefill == 0.0  # sessions without a prefill step: nothing to time apart


def test_the_draft_model_reads_the_prompts_last_tokens_and_lookup_all_of_it(models):
    seen = []

    class Recording:
        vocab_size, eos_token_ids, tokenizer_sha256 = VOCAB, frozenset({EOS}), None

        def session(self, prompt_ids):
            seen.append(list(prompt_ids))
            return models["close"].session(prompt_ids)

    session = HybridDrafter(Recording(), context=4).session(PROMPT)
    assert seen == [PROMPT[-4:]]
    found = session.index.match(PROMPT[:3])  # "17 42 99": only in the prompt's first 12 tokens
    assert found is not None and set(found[0]) == {3}  # lookup still reads the whole prompt
    HybridDrafter(Recording(), context=None).session(PROMPT)
    assert seen[-1] == PROMPT
    with pytest.raises(ValueError, match="context"):
        HybridDrafter(Recording(), context=0)


def test_short_matches_yield_to_the_model_where_its_drafts_hold_the_target_better():
    # The hybrid scores, per generation, how often a short lookup match (< DEEP_MATCH tokens) and
    # the model each offered the token the target then chose, and sends short-match contexts to
    # the model once the model's rate is higher by MODEL_MARGIN (`ShortMatchRule`).
    rule = ShortMatchRule()
    assert rule.short_pays()  # both start at the prior
    for _ in range(6):
        rule.short.record(False)
    assert rule.short_pays()  # 3.6 / 14 = 0.257: still within the margin of 0.45
    rule.short.record(False)
    assert not rule.short_pays()  # 3.6 / 15 = 0.24 < 0.45 - 0.2
    rule.model.record(False)
    assert rule.short_pays()  # the model's 0.4 is no longer 0.2 ahead

    model = FakeLM.markov(np.eye(12)[[(t + 1) % 12 for t in range(12)]])  # always drafts last + 1
    session = HybridDrafter(model).session([1, 2, 5, 3, 7, 8, 4, 1, 2])
    session.rule.short = Rate(PRIOR_RATE * PRIOR_WEIGHT, PRIOR_WEIGHT + 6)  # one miss from the margin
    session.extend([], [])  # "1 2" occurred before, followed by 5: a short match proposes
    assert session.forwards == 0 and session.rule.short_pays()
    session.accept([], [7])  # the target chose 7: the short match missed
    assert not session.rule.short_pays()
    root, _ = session.extend([], [])  # "2 7" never occurred: the model proposes 8
    assert session.forwards == 1 and int(root.argmax()) == 8
    session.extend([-1], [8])  # "7 8" occurred (then 4), but the model has the better record now
    assert session.forwards == 2
    session.accept([0], [4])  # the model's 8 was taken (a hit), then 4: the unused match's hit too
    assert (session.rule.model.hits, session.rule.model.seen) == (
        PRIOR_RATE * PRIOR_WEIGHT + 1,
        PRIOR_WEIGHT + 1,
    )
    assert (session.rule.short.hits, session.rule.short.seen) == (
        PRIOR_RATE * PRIOR_WEIGHT + 1,
        PRIOR_WEIGHT + 8,
    )
    root, _ = session.extend([], [])  # "7 8 4" matches (then 1), 3 tokens: short, so ...
    assert session.forwards == 3 and int(root.argmax()) == 5  # ... the model proposes
    session.accept([], [1])  # the unused match held the target's token: scored all the same
    assert (session.rule.short.hits, session.rule.short.seen) == (
        PRIOR_RATE * PRIOR_WEIGHT + 2,
        PRIOR_WEIGHT + 9,
    )
    assert session.rule.model.seen == PRIOR_WEIGHT + 1  # a model root with no drafts scores nothing


class _OnDevice:
    """A language model whose rows come back on another device ("meta": a stand-in for a GPU)."""

    def __init__(self, model: FakeLM, device: str) -> None:
        self.model, self.device = model, device
        self.vocab_size, self.eos_token_ids, self.tokenizer_sha256 = (
            model.vocab_size,
            model.eos_token_ids,
            None,
        )

    def session(self, prompt_ids):
        inner = self.model.session(prompt_ids)
        device = self.device

        class Session:
            def extend(self, parents, tokens):
                root, rows = inner.extend(parents, tokens)
                return root.to(device), rows.to(device)

            def accept(self, path, extra):
                inner.accept(path, extra)

        return Session()


def test_a_block_mixing_lookup_rows_and_a_gpu_models_rows_lands_on_the_models_device():
    # lookup rows are made on the CPU; a draft model on a GPU answers there: stacking the two
    # failed ("expected all tensors on the same device") whenever a level mixed them
    fake = FakeLM(12, lambda _context: np.linspace(0.0, 1.0, 12))
    session = HybridDrafter(_OnDevice(fake, "meta")).session([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    session.extend([], [])
    _, rows = session.extend([-1, -1], [3, 9])  # "1 2 3" is in the prompt (a lookup row), "1 2 9" not
    assert session.row_trust()[1] != session.row_trust()[2]  # one lookup row, one model row
    assert rows.shape == (2, 12) and rows.device.type == "meta"
