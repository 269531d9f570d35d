"""The evaluation run: prompts x settings x seeds -> one row per generation in results.jsonl.

Each row holds the raw figures: token IDs and text, block lengths, target/drafter forwards,
timings, the scored positions with their pivots (watermark key, and mse-pseudo's second key),
ln p under every score, LPPL, ROUGE-L. Everything in the summary is computed from rows, so a
summary can be rebuilt without models (`wmark eval --summary-only`).

Resumable: a row is appended (one line, flushed and fsynced) as soon as it is done, and a rerun
with the same output folder skips every row already there. A line torn by a crash is dropped on
the next start (`wmark.eval.results`); `run.json` pins what must not change between reruns
(target, key, token budget, logits processing), while methods, settings, prompts and seeds may
be added.

Seeds: the request seed of a row derives from (seed, prompt id) only, so every method sees the
same unkeyed randomness for the same prompt, and basic-uwm, pfr and mpfr emit the same text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from wmark.errors import InputError
from wmark.eval.detection import DEFAULT_TAU, mixed_pivots, text_pivots
from wmark.eval.metrics import lppl, rouge_l, scores
from wmark.eval.prompts import Prompt
from wmark.eval.results import ResultsFile  # named here too: bench/eval_checks.py imports it from here
from wmark.eval.rows import EvalRow
from wmark.generator.backend import LanguageModel
from wmark.generator.engine import METHODS, SamplerConfig, generate
from wmark.generator.logits import LogitsConfig, supports
from wmark.keymaterial import KeyMaterial
from wmark.prf import KeyedSource
from wmark.spec import MAX_CONTEXT_WIDTH

__all__ = [
    "EvalModels",
    "Job",
    "ResultsFile",
    "RunInfo",
    "Setting",
    "expand_settings",
    "lppl_key",
    "plan_jobs",
    "run_job",
    "target_probs",
]


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One sampler configuration of the grid.

    Attributes:
        method: a `METHODS` name.
        lookahead: L (None for basic-uwm, which drafts nothing).
        drafts: B (1 for single-draft methods).
        drafter: the drafter's name as given to `--drafter` (None for basic-uwm).
        draft_temperature: the drafter's temperature (None for basic-uwm).
    """

    method: str
    lookahead: int | None = None
    drafts: int = 1
    drafter: str | None = None
    draft_temperature: float | None = None

    def sampler(self, info: RunInfo) -> SamplerConfig:
        """The generation config of this setting within the run."""
        target = info.logits()
        temperature = self.draft_temperature if self.draft_temperature is not None else target.temperature
        draft = dataclasses.replace(target, temperature=temperature)
        return SamplerConfig(
            method=self.method,
            lookahead=self.lookahead if self.lookahead is not None else 1,
            draft_confidence=0.0,  # the paper's fixed lookahead: every branch drafts L levels
            drafts=self.drafts,
            max_new_tokens=info.max_new_tokens,
            target_logits=target,
            draft_logits=draft,
            diversity_bits=info.diversity_bits,
        )

    @property
    def key(self) -> str:
        """Stable identifier of the setting (part of each row id)."""
        lookahead, drafter = self.lookahead or "-", self.drafter or "-"
        return f"{self.method}|L{lookahead}|B{self.drafts}|{drafter}|T{self.draft_temperature or '-'}"


def expand_settings(
    methods: Sequence[str],
    *,
    lookaheads: Sequence[int],
    multi_lookaheads: Sequence[int],
    drafts: Sequence[int],
    drafters: Sequence[str],
    draft_temperatures: Sequence[float],
) -> list[Setting]:
    """The grid: basic-uwm once; single-draft methods at every L; multi-draft ones at every
    (L in `multi_lookaheads`, B in `drafts`); every speculative setting under every drafter x
    temperature.

    Raises:
        InputError: an unknown method (the message lists the known ones) or an invalid value.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method {unknown[0]!r}; known: {', '.join(METHODS)}")
    out: list[Setting] = []
    for method in dict.fromkeys(methods):
        spec = METHODS[method]
        if not spec.speculative:
            out.append(Setting(method=method))
            continue
        grid = (
            [(ell, b) for ell in multi_lookaheads for b in drafts]
            if spec.multi_draft
            else [(ell, 1) for ell in lookaheads]
        )
        for drafter in drafters:
            for temperature in draft_temperatures:
                out += [
                    Setting(
                        method=method, lookahead=ell, drafts=b, drafter=drafter, draft_temperature=temperature
                    )
                    for ell, b in grid
                ]
    return out


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What every row of one output folder shares (run.json); reruns must match it."""

    target: str
    key_id: str
    key_fingerprint: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    diversity_bits: float
    default_drafter: str
    default_draft_temperature: float
    prompts: str
    spec: str = ""  # the key's WatermarkSpec (JSON), once models have been loaded
    prompt_template: str = "chat"  # CNN/DailyMail's template (run.json files from before it: chat)

    def logits(self) -> LogitsConfig:
        """The target's logits processing."""
        return LogitsConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    _PINNED = (
        "target",
        "key_id",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "diversity_bits",
        "prompt_template",
    )

    def check_compatible(self, stored: RunInfo, folder: Path) -> None:
        """Raise unless `stored` (the folder's run.json) pins the same run-level settings."""
        for name in self._PINNED:
            ours, theirs = getattr(self, name), getattr(stored, name)
            if ours != theirs:
                raise InputError(
                    f"{folder} holds a run with {name}={theirs!r}, not {ours!r}: "
                    "use the same settings to resume, or another --out"
                )

    @classmethod
    def load(cls, path: Path) -> RunInfo:
        """Read run.json."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"{path}: not a wmark eval run description ({exc})") from None

    def save(self, path: Path) -> None:
        """Write run.json."""
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


@dataclass(frozen=True)
class Job:
    """One generation to run: a prompt under a setting with a seed."""

    prompt: Prompt
    setting: Setting
    seed: int

    @property
    def prompt_key(self) -> str:
        """The prompt's id and content hash: a changed prompt (same id, new content) is a new prompt."""
        return f"{self.prompt.id}#{self.prompt.sha256[:12]}"

    @property
    def row_id(self) -> str:
        """Identifies the row."""
        return f"{self.prompt_key}|{self.setting.key}|s{self.seed}"

    @property
    def request_seed(self) -> int:
        """The request seed: a function of (seed, prompt id) only, shared by every method."""
        digest = hashlib.sha256(f"wmark.eval.v1|{self.seed}|{self.prompt.id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1


def plan_jobs(prompts: Sequence[Prompt], settings: Sequence[Setting], seeds: Sequence[int]) -> list[Job]:
    """Every (prompt, setting, seed), prompt by prompt: an interrupted run covers all methods evenly."""
    return [Job(p, s, seed) for p in prompts for seed in seeds for s in settings]


@dataclass
class EvalModels:
    """The loaded models and the tokenizer functions of a run.

    Attributes:
        target: the target model.
        drafters: drafter models by the name given to `--drafter`.
        encode: a prompt's token IDs (chat template applied).
        encode_text: plain text -> token IDs (references, for ROUGE-L).
        decode: token IDs -> text.
    """

    target: LanguageModel
    drafters: Mapping[str, LanguageModel]
    encode: Callable[[Prompt], list[int]]
    encode_text: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    lppl_cache: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)


def target_probs(
    target: LanguageModel, prompt_ids: Sequence[int], token_ids: Sequence[int], logits: LogitsConfig
) -> list[float]:
    """P_proc(y_t | prefix) of each generated token, from one target forward over the whole text."""
    session = target.session(prompt_ids)
    root, nodes = session.extend(list(range(-1, len(token_ids) - 1)), list(token_ids))
    dists = supports(torch.cat([root[None], nodes[:-1]]), logits)
    return [d.prob_of(t) for d, t in zip(dists, token_ids, strict=True)]


def lppl_key(prompt_key: str, token_ids: Sequence[int]) -> str:
    """Cache key of a text's LPPL (it depends on the prompt and the tokens only, within a run)."""
    return hashlib.sha256(json.dumps([prompt_key, list(token_ids)]).encode()).hexdigest()


def run_job(
    job: Job,
    *,
    models: EvalModels,
    key: KeyMaterial,
    info: RunInfo,
    on_block: Callable[[int], None] | None = None,
) -> EvalRow:
    """Generate one row and compute its figures."""
    setting = job.setting
    prompt_ids = models.encode(job.prompt)
    drafter = models.drafters[setting.drafter] if setting.drafter is not None else None
    result = generate(
        models.target,
        prompt_ids,
        config=setting.sampler(info),
        key=key,
        drafter=drafter,
        seed=job.request_seed,
        decode=models.decode,
        on_block=on_block,
    )
    tokens = list(result.token_ids)
    pivots = text_pivots(prompt_ids, tokens, KeyedSource(key.secret, key.spec))
    mixed = mixed_pivots(pivots.u1, pivots.u2, pivots.r, DEFAULT_TAU)
    text_key = lppl_key(job.prompt_key, tokens)
    if text_key not in models.lppl_cache:  # equal texts (basic-uwm, pfr, mpfr, ...) need one forward
        models.lppl_cache[text_key] = lppl(target_probs(models.target, prompt_ids, tokens, info.logits()))
    mean_nll, dropped = models.lppl_cache[text_key]
    reference = job.prompt.reference
    return EvalRow(
        row_id=job.row_id,
        prompt_id=job.prompt.id,
        prompt_key=job.prompt_key,
        method=setting.method,
        lookahead=setting.lookahead,
        drafts=setting.drafts,
        drafter=setting.drafter,
        draft_temperature=setting.draft_temperature,
        seed=job.seed,
        request_seed=job.request_seed,
        keyed=METHODS[setting.method].keyed,
        prompt_len=len(prompt_ids),
        prompt_tail=prompt_ids[-MAX_CONTEXT_WIDTH:],
        token_ids=tokens,
        text=result.text,
        n_tokens=len(tokens),
        stop_reason=result.stop_reason,
        blocks=list(result.blocks),
        drafted=list(result.drafted),
        masked_positions=list(result.masked_positions),
        diverse_positions=list(result.diverse_positions),
        target_forwards=result.target_forwards,
        draft_forwards=result.draft_forwards,
        aatps=result.aatps,
        tokens_per_s=result.tokens_per_s,
        timings=dataclasses.asdict(result.timings),
        scored_positions=pivots.positions.tolist(),
        pivots=pivots.u1.tolist(),
        pivots_k2=pivots.u2.tolist(),
        r_k2=pivots.r.tolist(),
        n_scored=len(pivots.positions),
        log_p=scores(pivots.u1),
        log_p_pseudo=scores(mixed),
        lppl=mean_nll,
        lppl_dropped=dropped,
        rouge_l=rouge_l(tokens, models.encode_text(reference)) if reference else None,
    )
