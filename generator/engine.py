"""The generation loop: blocks until EOS or the token budget, with the clocks' bookkeeping.

    result = generate(target, prompt_ids, config=SamplerConfig(method="mpfr", drafts=4),
                      key=key_material, drafter=drafter, seed=7)

The loop owns nothing model-specific: it asks a block function (basic-uwm, PFR/MPFR tree, or a
baseline) for the next emitted tokens, commits them to the clock policy (so the repeated-window
mask is exactly what the detector recomputes from the text) and keeps per-block statistics.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from wmark.errors import InputError, TokenizerError
from wmark.generator.backend import LanguageModel, PrefillSession, Session
from wmark.generator.baselines.gls import gls_block
from wmark.generator.baselines.pseudo import mse_pseudo_block
from wmark.generator.baselines.reweight import mse_block, mws_block, vsps_block
from wmark.generator.blocks import Block, BlockInputs
from wmark.generator.clocks import ClockKind, ClockPolicy
from wmark.generator.logits import LogitsConfig
from wmark.generator.names import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_LOOKAHEAD, METHOD_NAMES
from wmark.generator.result import GenerationResult, Timings
from wmark.generator.speculative import autoregressive_block, tree_block
from wmark.keymaterial import KeyMaterial

__all__ = ["METHODS", "SamplerConfig", "check_key_binding", "generate", "request_nonce"]

# B: counted on CPU (bench/draft_rules.py), 3 drafts beat 2 on every built-in prompt set and 4 gained
# nothing more: an extra verify row costs little next to a target forward (BENCHMARKS.md)
DEFAULT_DRAFTS = 3
MAX_DRAFTS = 64
MAX_LOOKAHEAD = 32

BlockFn = Callable[[BlockInputs], Block]


@dataclass(frozen=True)
class Method:
    """A sampler: its block function and what it needs."""

    block: BlockFn
    keyed: bool  # uses the watermark key
    speculative: bool  # needs a drafter
    multi_draft: bool  # accepts drafts > 1


METHODS: dict[str, Method] = {
    "basic-uwm": Method(autoregressive_block, keyed=True, speculative=False, multi_draft=False),
    "pfr": Method(tree_block, keyed=True, speculative=True, multi_draft=False),
    "pfr-nowm": Method(tree_block, keyed=False, speculative=True, multi_draft=False),
    "mpfr": Method(tree_block, keyed=True, speculative=True, multi_draft=True),
    # baselines (docs/algorithms.md §6)
    "vsps": Method(vsps_block, keyed=False, speculative=True, multi_draft=False),
    "mws": Method(mws_block, keyed=True, speculative=True, multi_draft=False),
    "mse": Method(mse_block, keyed=True, speculative=True, multi_draft=False),
    "mse-pseudo": Method(mse_pseudo_block, keyed=True, speculative=True, multi_draft=False),
    "gls": Method(gls_block, keyed=False, speculative=True, multi_draft=True),
}
assert tuple(METHODS) == METHOD_NAMES


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """How to generate.

    Attributes:
        method: one of `METHODS`.
        lookahead: L, draft depth per block (default 6; with `draft_confidence` most branches end
            sooner). The paper's fixed lookahead is `lookahead=4, draft_confidence=0`.
        drafts: B, drafts per block (multi-draft methods only; None: 3 for them, else 1).
        max_new_tokens: budget of generated tokens (EOS counts as one).
        target_logits / draft_logits: logits processing of each model (same top-k/top-p by
            default; the draft temperature may differ).
        diversity_bits: surprisal budget of the unkeyed prefix that lets equal prompts differ.
        draft_confidence: dynamic lookahead: a draft branch ends at a token the drafter gave less
            than this probability (default 0.8; 0: always draft L levels). Block lengths only,
            never the text. The tree samplers (pfr, pfr-nowm, mpfr, gls) only: the chain
            baselines (vsps, mws, mse, mse-pseudo) draft L tokens, as their papers define them.
        lookup_lookahead: with a prompt-lookup drafter (ngram, auto), branches go on past L to
            this depth with lookup drafts while the text matches (they cost no drafter forward,
            only verify rows); 0 or <= L: off.
        min_reach: a draft becomes a verify row only if the estimated chance that the target
            reaches and accepts it (the product of its path's draft probabilities, lookup rows
            discounted by their measured accuracy) is at least this (0: every draft). A verify
            row has a cost (BENCHMARKS.md, "Kernels"), so a rarely accepted draft slows the block.
        max_rows: at most this many drafts per block, the likeliest first (0: no cap).
    """

    method: str = "mpfr"
    lookahead: int = DEFAULT_LOOKAHEAD
    drafts: int | None = None
    max_new_tokens: int = 128
    target_logits: LogitsConfig = field(default_factory=LogitsConfig)
    draft_logits: LogitsConfig = field(default_factory=LogitsConfig)
    diversity_bits: float = 16.0
    draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE
    lookup_lookahead: int = 0
    min_reach: float = 0.0
    max_rows: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"unknown method {self.method!r}; known: {', '.join(METHODS)}")
        method = METHODS[self.method]
        if self.drafts is None:
            object.__setattr__(self, "drafts", DEFAULT_DRAFTS if method.multi_draft else 1)
        assert self.drafts is not None
        if not 1 <= self.lookahead <= MAX_LOOKAHEAD:
            raise InputError(f"lookahead must be in 1..{MAX_LOOKAHEAD}, got {self.lookahead}")
        if not 1 <= self.drafts <= MAX_DRAFTS:
            raise InputError(f"drafts must be in 1..{MAX_DRAFTS}, got {self.drafts}")
        if self.drafts > 1 and not method.multi_draft:
            raise InputError(f"{self.method} is single-draft: use --drafts 1 (or method mpfr)")
        if self.max_new_tokens < 1:
            raise InputError("max_new_tokens must be at least 1")
        if self.diversity_bits < 0:
            raise InputError("diversity_bits must be >= 0")
        if not 0 <= self.lookup_lookahead <= MAX_LOOKAHEAD:
            raise InputError(f"lookup_lookahead must be in 0..{MAX_LOOKAHEAD}, got {self.lookup_lookahead}")
        if not 0.0 <= self.draft_confidence < 1.0:
            raise InputError("draft_confidence must be in [0, 1)")
        if not 0.0 <= self.min_reach < 1.0:
            raise InputError("min_reach must be in [0, 1)")
        if self.max_rows < 0:
            raise InputError("max_rows must be >= 0 (0: no cap)")


def request_nonce(seed: int | None) -> bytes:
    """The request's unkeyed randomness: derived from `seed`, else fresh from the OS."""
    if seed is None:
        return os.urandom(32)
    return hashlib.sha256(b"wmark.request-seed.v1" + seed.to_bytes(16, "big", signed=True)).digest()


def check_key_binding(key: KeyMaterial, target: LanguageModel) -> None:
    """A key marks only text written with the tokenizer it is bound to.

    The detector tokenises with the key's tokenizer; text generated with another one would be
    read as other token IDs and never detected. Models of unknown tokenizer (raw IDs) pass.

    Raises:
        TokenizerError: the target's tokenizer is known and is not the key's.
    """
    actual = target.tokenizer_sha256
    if actual is not None and actual != key.spec.tokenizer.sha256:
        raise TokenizerError(
            f"key {key.key_id} is bound to tokenizer {key.spec.tokenizer.sha256[:12]}, but the target's "
            f"tokenizer is {actual[:12]}: create a key with --tokenizer pointing at this model"
        )


def generate(
    target: LanguageModel,
    prompt_ids: Sequence[int],
    *,
    config: SamplerConfig,
    key: KeyMaterial | None = None,
    drafter: LanguageModel | None = None,
    seed: int | None = None,
    decode: Callable[[Sequence[int]], str] | None = None,
    on_block: Callable[[int], None] | None = None,
    on_emit: Callable[[Sequence[int]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerationResult:
    """Generate from `prompt_ids` with the configured sampler.

    Args:
        target: the model whose distribution the output follows exactly.
        prompt_ids: the prompt's token IDs (chat template already applied).
        config: sampler settings.
        key: the watermark key (required by keyed methods, ignored by unkeyed ones).
        drafter: the draft model (required by speculative methods); must share the target's vocabulary.
        seed: makes the unkeyed randomness reproducible; None draws it from the OS.
        decode: token IDs -> text, for `GenerationResult.text`.
        on_block: called after each block with the number of tokens generated so far (progress bars).
        on_emit: called after each block with the tokens it emitted (streaming).
        should_stop: asked before each block; True ends generation there with stop_reason
            "cancelled" (a server stops the generation of a client that went away).
    """
    method = METHODS[config.method]
    _check_request(method, config, prompt_ids, target, key, drafter)
    policy = ClockPolicy(
        key if method.keyed else None,
        request_nonce(seed),
        prompt_len=len(prompt_ids),
        diversity_bits=config.diversity_bits if method.keyed else 0.0,
        context_width=key.spec.context_width if key is not None else 4,
        spec_version=key.spec.spec_version if key is not None else 1,
    )
    target_session = target.session(prompt_ids)
    draft_session = drafter.session(prompt_ids) if method.speculative and drafter is not None else None
    prefill_s = 0.0
    if should_stop is None or not should_stop():  # a client gone already costs no prefill
        prefill_s = _prefill(target_session) + _prefill(draft_session)

    sessions = (target_session, draft_session)
    run = _Transcript(list(prompt_ids), len(prompt_ids))
    stop_reason = "length"
    start = time.perf_counter()
    while run.generated < config.max_new_tokens:
        if should_stop is not None and should_stop():
            stop_reason = "cancelled"
            break
        remaining = config.max_new_tokens - run.generated
        inputs = _block_inputs(config, sessions, run.tokens, remaining, policy, target.eos_token_ids)
        block = method.block(inputs)
        run.record(block, policy)
        if on_block is not None:
            on_block(run.generated)
        if on_emit is not None:
            on_emit(run.tokens[len(run.tokens) - len(block.emitted) :])
        if run.tokens[-1] in target.eos_token_ids:
            stop_reason = "eos"
            break
    total = time.perf_counter() - start
    generated = tuple(run.tokens[len(prompt_ids) :])
    return GenerationResult(
        token_ids=generated,
        text=decode(generated) if decode is not None else "",
        prompt_ids=tuple(prompt_ids),
        method=config.method,
        key_id=key.key_id if key is not None and method.keyed else None,
        blocks=tuple(run.blocks),
        drafted=tuple(run.drafted),
        masked_positions=tuple(run.masked),
        diverse_positions=tuple(run.diverse),
        target_forwards=getattr(target_session, "forwards", len(run.blocks)),
        draft_forwards=getattr(draft_session, "forwards", 0),
        stop_reason=stop_reason,
        timings=Timings(
            prefill=prefill_s,
            draft=run.draft_s,
            verify=run.verify_s,
            bookkeeping=max(0.0, total - run.draft_s - run.verify_s),
        ),
    )


def _check_request(
    method: Method,
    config: SamplerConfig,
    prompt_ids: Sequence[int],
    target: LanguageModel,
    key: KeyMaterial | None,
    drafter: LanguageModel | None,
) -> None:
    """Refuse a request the method cannot serve (`InputError`; a key bound elsewhere: `TokenizerError`)."""
    if not prompt_ids:
        raise InputError("the prompt is empty")
    if method.keyed and key is None:
        raise InputError(f"{config.method} needs a watermark key")
    if method.speculative and drafter is None:
        raise InputError(f"{config.method} needs a drafter model")
    if max(prompt_ids) >= target.vocab_size or min(prompt_ids) < 0:
        raise InputError("prompt token IDs are outside the target's vocabulary")
    if method.keyed and key is not None:
        check_key_binding(key, target)


def _block_inputs(
    config: SamplerConfig,
    sessions: tuple[Session, Session | None],
    tokens: list[int],
    remaining: int,
    policy: ClockPolicy,
    eos: frozenset[int],
) -> BlockInputs:
    """The next block's inputs: the (target, drafter) sessions, the committed text and what the
    config allows."""
    return BlockInputs(
        target=sessions[0],
        drafter=sessions[1],
        committed=tokens,
        remaining=remaining,
        policy=policy,
        target_logits=config.target_logits,
        draft_logits=config.draft_logits,
        eos=eos,
        lookahead=min(config.lookahead, remaining - 1),
        drafts=config.drafts or 1,
        draft_confidence=config.draft_confidence,
        lookup_lookahead=min(config.lookup_lookahead, remaining - 1),
        min_reach=config.min_reach,
        max_rows=config.max_rows,
    )


@dataclass
class _Transcript:
    """What a generation has emitted so far, block by block: the text and the result's statistics."""

    tokens: list[int]  # the prompt, then every emitted token
    prompt_len: int
    blocks: list[int] = field(default_factory=list)  # tokens emitted per block
    drafted: list[int] = field(default_factory=list)
    masked: list[int] = field(default_factory=list)  # generated positions under a masked clock
    diverse: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def record(self, block: Block, policy: ClockPolicy) -> None:
        """Append a block's emissions, committing each to the clocks (the repeated-window mask
        is then exactly what the detector recomputes from the text)."""
        self.draft_s += block.draft_seconds
        self.verify_s += block.verify_seconds
        self.blocks.append(len(block.emitted))
        self.drafted.append(block.drafted)
        for emission in block.emitted:
            if emission.kind is ClockKind.MASKED:
                self.masked.append(self.generated)
            elif emission.kind is ClockKind.DIVERSE:
                self.diverse.append(self.generated)
            policy.commit(self.tokens, emission.kind, emission.prob)
            self.tokens.append(emission.token)


def _prefill(session: Session | None) -> float:
    """Run a session's prompt prefill now, where it can (`PrefillSession`); its seconds."""
    if not isinstance(session, PrefillSession):
        return 0.0
    start = time.perf_counter()
    session.prefill()
    return time.perf_counter() - start
