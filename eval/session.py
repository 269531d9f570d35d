"""One evaluation folder from start to finish: what `wmark eval` does between its options and its output.

`EvalSession(config)` checks every setting, loads the prompts, resumes the folder's run.json and
plans the jobs; `run()` generates the rows the folder does not have yet (loading the models and
choosing the key only then); `write_outputs()` writes summary.md and the plots from the rows.
Progress goes to an optional `EvalProgress` (the CLI draws bars with it; a notebook can print).

Interrupts: every row is appended durably as soon as it is done, so a KeyboardInterrupt while
generating loses at most the row in progress. `run()` turns it into `EvalInterrupted`, which says
how many new rows were saved; rerunning the same folder resumes after them.

The key: a registry key (`config.key`, opened with `KeyRegistry.open()`, which reads the
environment, and checked against the target's tokenizer), or a key derived from
`config.key_seed`, reproducible without any registry.

Attacks: `write_attacks()` edits every row's answer with the named attacks (`wmark.eval.attacks`)
and detects the results (`wmark.eval.robustness`) into attacks.jsonl, attacks.md and attacks.png.
Only the paraphrase attack loads a model (the target, to rewrite the answers); everything else,
and the thresholds from a negative corpus (`negative_thresholds()`), needs the key and the
target's tokenizer alone, so `--summary-only` stays model-free unless a paraphrase is asked for
that the folder's paraphrases.jsonl does not keep yet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from wmark.detector import TextTokenizer
from wmark.errors import InputError
from wmark.eval.prompts import load_prompt_set
from wmark.eval.results import ResultsFile
from wmark.eval.rows import EvalRow
from wmark.eval.runner import Job, RunInfo, expand_settings, lppl_key, plan_jobs, run_job
from wmark.generator.engine import check_key_binding
from wmark.generator.models.loading import ModelPair
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry
from wmark.secret import Secret
from wmark.spec import WatermarkSpec

if TYPE_CHECKING:
    from wmark.eval.negatives import NegativeThresholds
    from wmark.eval.paraphrase import ParaphraseCache

__all__ = [
    "EVAL_KEY_TAG",
    "EvalConfig",
    "EvalInterrupted",
    "EvalProgress",
    "EvalSession",
    "eval_key_secret",
]

EVAL_KEY_TAG = b"wmark.eval-key.v1"


def eval_key_secret(key_seed: str) -> Secret:
    """The evaluation key derived from a seed string (reproducible runs without a key registry)."""
    return Secret(hashlib.sha256(EVAL_KEY_TAG + key_seed.encode()).digest())


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """What an evaluation runs (the options of `wmark eval`, parsed).

    Attributes:
        out: the output folder; an existing one is resumed.
        prompts / limit: the prompt set (`load_prompt_set`) and how many of its prompts to use.
        prompt_template: CNN/DailyMail's template, "chat" or "hu-huang" (pinned by run.json).
        methods, lookaheads, multi_lookaheads, drafts: the settings grid (`expand_settings`);
            `multi_lookaheads` defaults to the largest of `lookaheads`.
        drafters / draft_temperatures: drafter conditions; the first of each is the run's default,
            and the temperatures default to the target's.
        seeds: request seeds; each prompt runs once per seed.
        target: 'embedded', a local model folder or a cached HF model id.
        key / key_seed: a registry key id, or (None) the seed of the derived evaluation key.
        max_new_tokens, temperature, top_k, top_p, diversity_bits: run-level generation settings
            (pinned by run.json).
        chat, device, precision: how prompts are encoded and models loaded.
    """

    out: Path
    prompts: str = "builtin"
    limit: int | None = None
    prompt_template: str = "chat"
    methods: Sequence[str]
    lookaheads: Sequence[int] = (1, 2, 3, 4)
    multi_lookaheads: Sequence[int] | None = None
    drafts: Sequence[int] = (2, 4, 6, 8)
    drafters: Sequence[str] = ("embedded",)
    draft_temperatures: Sequence[float] | None = None
    seeds: Sequence[int] = (0,)
    target: str = "embedded"
    key: str | None = None
    key_seed: str = "wmark-eval"
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    diversity_bits: float = 0.0
    chat: bool = True
    device: str = "cpu"
    precision: str = "auto"


class EvalProgress(Protocol):
    """Receives the progress of `EvalSession.run` (called from the running thread)."""

    def loading(self, message: str) -> None:
        """Models are loading; `message` says which step."""

    def started(self, jobs: int, max_new_tokens: int) -> None:
        """Models loaded; `jobs` generations of at most `max_new_tokens` tokens follow."""

    def job_started(self, job: Job) -> None:
        """A generation begins."""

    def tokens(self, generated: int) -> None:
        """The generation in progress has `generated` tokens."""

    def job_done(self, row: EvalRow) -> None:
        """A generation's row is saved."""


class EvalInterrupted(Exception):
    """Generation was interrupted (KeyboardInterrupt); every finished row is saved.

    Attributes:
        new_rows: rows saved by this run before the interrupt.
        results: the results.jsonl they are in.
    """

    def __init__(self, new_rows: int, results: Path) -> None:
        super().__init__(f"interrupted: {new_rows} new rows saved in {results}")
        self.new_rows = new_rows
        self.results = results


class EvalSession:
    """One output folder: its run description, its rows and the jobs still to run.

    Construction does everything that needs no model: it raises `InputError` for an invalid
    setting, an unreadable prompt set or a folder made with other run-level settings before
    anything slow happens.
    """

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        lookaheads = list(config.lookaheads)
        temperatures = list(config.draft_temperatures or [config.temperature])
        self.settings = expand_settings(
            config.methods,
            lookaheads=lookaheads,
            multi_lookaheads=list(config.multi_lookaheads or [max(lookaheads)]),
            drafts=config.drafts,
            drafters=config.drafters,
            draft_temperatures=temperatures,
        )
        self._secret = eval_key_secret(config.key_seed) if config.key is None else None
        info = RunInfo(
            target=config.target,
            key_id=config.key or f"wk_eval_{hashlib.sha256(config.key_seed.encode()).hexdigest()[:8]}",
            key_fingerprint=self._secret.fingerprint() if self._secret is not None else "",
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            diversity_bits=config.diversity_bits,
            default_drafter=config.drafters[0],
            default_draft_temperature=temperatures[0],
            prompts=config.prompts,
            spec="",
            prompt_template=config.prompt_template,
        )
        for setting in self.settings:
            setting.sampler(info)  # every invalid value fails here, before any model loads
        prompt_set = load_prompt_set(config.prompts, limit=config.limit, template=config.prompt_template)
        config.out.mkdir(parents=True, exist_ok=True)
        self.info = _resume_info(info, self.run_json)
        self.results = ResultsFile(config.out / "results.jsonl")
        self.plan = plan_jobs(prompt_set.prompts, self.settings, config.seeds)

    @property
    def run_json(self) -> Path:
        """The folder's run description."""
        return self.config.out / "run.json"

    def rows(self) -> list[EvalRow]:
        """The rows already in the folder (read-only: safe while another process appends)."""
        return self.results.load()

    def run(self, progress: EvalProgress | None = None) -> list[EvalRow]:
        """Generate every planned row the folder lacks; returns all of the folder's rows.

        Raises:
            InputError: another process is writing to the folder, or it was made with another
                key spec.
            EvalInterrupted: a KeyboardInterrupt while generating (finished rows are saved).
        """
        with self.results.locked():
            rows = self.results.load(repair=True)
            done = {r.row_id for r in rows}
            pending = [j for j in self.plan if j.row_id not in done]
            if pending:
                rows += self._generate(pending, rows, progress)
        return rows

    def write_outputs(
        self, rows: Sequence[EvalRow], *, plots: bool = True, negatives: NegativeThresholds | None = None
    ) -> list[Path]:
        """Write summary.md (and, with `plots`, the PNG figures); returns the files written.

        Args:
            rows: the run's rows.
            plots: write the PNG figures too.
            negatives: thresholds from a negative corpus, reported beside the analytic ones.

        Raises:
            InputError: there are no rows yet.
        """
        from wmark.eval.summary import render_summary

        if not rows:
            raise InputError(f"{self.config.out}: no results yet; run without --summary-only first")
        summary = self.config.out / "summary.md"
        spec = WatermarkSpec.from_json(self.info.spec)
        summary.write_text(render_summary(rows, self.info, spec, negatives))
        written = [summary]
        if plots:
            from wmark.eval.plots import write_plots  # matplotlib only when plots are wanted

            written += write_plots(rows, self.info, self.config.out)
        return written

    def write_attacks(
        self,
        rows: Sequence[EvalRow],
        attacks: Sequence[str],
        *,
        lengths: Sequence[int],
        seed: int,
        plots: bool,
        paraphrase_limit: int | None = None,
        negatives: NegativeThresholds | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> list[Path]:
        """Attack every row's answer, detect it, and write attacks.jsonl, attacks.md (and attacks.png).

        Detection needs the key and the target's tokenizer only; the target model is loaded only
        when the paraphrase attack needs a paraphrase that paraphrases.jsonl does not keep.

        Args:
            rows / attacks / lengths / seed: what to attack, how, at which answer lengths, seeded.
            plots: write attacks.png.
            paraphrase_limit: paraphrase the answers of at most this many rows (watermarked first).
            negatives: thresholds from a negative corpus, reported beside the analytic ones.
            progress: told what is happening (model loading, each paraphrase).

        Raises:
            InputError: no rows yet, or the target's tokenizer cannot be read without the model.
        """
        from wmark.eval.attacks import ATTACKS
        from wmark.eval.robustness import attack_rows, plot_attacks, render_attacks

        key, tokenizer_json = self.detection_key()
        tokenizer = TextTokenizer(tokenizer_json, key.spec.tokenizer.name)
        paraphrase = None
        if any(ATTACKS[name].level == "model" for name in attacks):
            paraphrase = self._paraphrases(progress)
        found = attack_rows(
            rows,
            attacks,
            key=key,
            tokenizer_json=tokenizer_json,
            decode=tokenizer.decode,
            lengths=lengths,
            seed=seed,
            paraphrase=paraphrase,
            paraphrase_limit=paraphrase_limit,
            progress=progress,
        )
        jsonl = self.config.out / "attacks.jsonl"
        jsonl.write_text("".join(json.dumps(r.to_json()) + "\n" for r in found))
        table = self.config.out / "attacks.md"
        table.write_text(render_attacks(found, negatives=negatives))
        written = [jsonl, table]
        if plots and (figure := plot_attacks(found, self.config.out)) is not None:
            written.append(figure)
        return written

    def detection_key(self) -> tuple[KeyMaterial, bytes]:
        """The run's key and the target's tokenizer.json: all detection needs (no model).

        Raises:
            InputError: no rows yet (no key spec), or the target's tokenizer is not the run's.
        """
        from wmark.detector.tokenize import read_tokenizer_source
        from wmark.generator.models.embedded import embedded_tokenizer_json

        if not self.info.spec:
            raise InputError(f"{self.config.out}: no results yet; run without --summary-only first")
        spec = WatermarkSpec.from_json(self.info.spec)
        tokenizer_json, _ = read_tokenizer_source(self.config.target, embedded_tokenizer_json)
        if TextTokenizer(tokenizer_json, spec.tokenizer.name).sha256 != spec.tokenizer.sha256:
            raise InputError(
                f"{self.config.target}'s tokenizer is not the one {self.config.out} was made with"
            )
        if self.config.key is not None:
            with KeyRegistry.open() as registry:
                return registry.material(self.config.key), tokenizer_json
        assert self._secret is not None
        return KeyMaterial(key_id=self.info.key_id, secret=self._secret, spec=spec), tokenizer_json

    def negative_thresholds(
        self, docs: Sequence[str], source: str, lengths: Sequence[int]
    ) -> NegativeThresholds:
        """Detection thresholds at each answer length from unwatermarked documents (`wmark.eval.negatives`).

        Raises:
            InputError: no rows yet, or the target's tokenizer is not the run's.
        """
        from wmark.eval.negatives import calibrate_negatives

        key, tokenizer_json = self.detection_key()
        return calibrate_negatives(
            docs, key=key, tokenizer_json=tokenizer_json, lengths=lengths, source=source
        )

    def _paraphrases(self, progress: Callable[[str], None] | None) -> ParaphraseCache:
        """Paraphrases by the target, kept in paraphrases.jsonl; the target (no drafter: it samples
        plainly, one token a forward) loads at the first paraphrase the file does not have."""
        from wmark.eval.paraphrase import PARAPHRASE_INSTRUCTION, ParaphraseCache, Paraphraser

        config, info = self.config, self.info

        def load() -> Paraphraser:
            from wmark.eval.models import load_models

            models, _ = load_models(
                config.target,
                [],
                device=config.device,
                precision=config.precision,
                chat=config.chat,
                progress=progress,
            )
            return Paraphraser(
                models.target, encode=models.encode, decode=models.decode, logits=info.logits()
            )

        settings = [info.target, info.spec, config.chat, config.precision, dataclasses.asdict(info.logits())]
        context = json.dumps([*settings, PARAPHRASE_INSTRUCTION])
        return ParaphraseCache(config.out / "paraphrases.jsonl", context, load)

    def _generate(
        self, pending: list[Job], rows: Sequence[EvalRow], progress: EvalProgress | None
    ) -> list[EvalRow]:
        """Load the models and run the pending jobs; a new folder gets its run.json here."""
        from wmark.eval.models import load_models

        config = self.config
        if progress is not None:
            progress.loading("loading models")
        models, pair = load_models(
            config.target,
            config.drafters,
            device=config.device,
            precision=config.precision,
            chat=config.chat,
            progress=progress.loading if progress is not None else None,
        )
        models.lppl_cache.update(
            {lppl_key(r.prompt_key, r.token_ids): (r.lppl, r.lppl_dropped) for r in rows}
        )
        material = self._key_material(pair)
        if not self.info.spec:
            self.info = dataclasses.replace(
                self.info, key_fingerprint=material.secret.fingerprint(), spec=material.spec.to_json()
            )
            self.info.save(self.run_json)
        elif self.info.spec != material.spec.to_json():
            raise InputError(f"{config.out} was made with another key spec (tokenizer): use another --out")
        if progress is not None:
            progress.started(len(pending), self.info.max_new_tokens)
        new: list[EvalRow] = []
        try:
            for job in pending:
                if progress is not None:
                    progress.job_started(job)
                row = run_job(
                    job,
                    models=models,
                    key=material,
                    info=self.info,
                    on_block=progress.tokens if progress is not None else None,
                )
                self.results.append(row)
                new.append(row)
                if progress is not None:
                    progress.job_done(row)
        except KeyboardInterrupt:
            raise EvalInterrupted(len(new), self.results.path) from None
        return new

    def _key_material(self, pair: ModelPair) -> KeyMaterial:
        """The registry key (checked against the target's tokenizer) or the derived evaluation key."""
        if self.config.key is not None:
            with KeyRegistry.open() as registry:
                material = registry.material(self.config.key, for_generation=True)
            check_key_binding(material, pair.target)
            return material
        assert self._secret is not None
        ref = TextTokenizer(pair.tokenizer_json, "target").ref
        return KeyMaterial(key_id=self.info.key_id, secret=self._secret, spec=WatermarkSpec(tokenizer=ref))


def _resume_info(info: RunInfo, run_json: Path) -> RunInfo:
    """The run description to use: `info` for a new folder, else the stored one (which must match).

    A folder keeps its first run's default drafter condition, key fingerprint and spec; later
    runs may add methods, settings, drafters, prompts and seeds.
    """
    if not run_json.exists():
        return info
    stored = RunInfo.load(run_json)
    info.check_compatible(stored, run_json.parent)
    return stored
