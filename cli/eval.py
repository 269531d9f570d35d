"""`wmark eval`: every method side by side on the same prompts -> results.jsonl, summary.md, plots."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status

from wmark.cli.common import err_console
from wmark.errors import InputError
from wmark.generator.names import METHOD_NAMES, PRECISION_HELP

if TYPE_CHECKING:  # torch, transformers and matplotlib load only when the command runs
    from wmark.eval.rows import EvalRow
    from wmark.eval.runner import Job

N = TypeVar("N", int, float)


def _ints(option: str, text: str) -> list[int]:
    return _numbers(option, text, int, "integers")


def _floats(option: str, text: str) -> list[float]:
    return _numbers(option, text, float, "numbers")


def _numbers(option: str, text: str, kind: Callable[[str], N], what: str) -> list[N]:
    """A comma-separated option value; a one-line InputError for anything else."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{option}: expected comma-separated {what}, got {text!r}") from None
    if not values:
        raise InputError(f"{option}: give at least one value")
    return values


def _names(option: str, text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise InputError(f"{option}: give at least one value")
    return values


def eval_cmd(
    out: Annotated[
        Path, typer.Option(help="Output folder (results.jsonl, summary.md, plots); reuse it to resume.")
    ],
    prompts: Annotated[
        str,
        typer.Option(
            help="builtin, eli5-mini, summaries-mini, code-mini, a JSONL file, cnn_dailymail:PATH, eli5:PATH."
        ),
    ] = "builtin",
    prompt_template: Annotated[
        str,
        typer.Option(
            help="CNN/DailyMail prompts: 'chat' (system + user 'Summarize ... in 3-5 sentences', chat "
            "template) or 'hu-huang' (Hu and Huang's plain System:/INPUT:/OUTPUT: prompt, no chat template)."
        ),
    ] = "chat",
    methods: Annotated[str, typer.Option(help=f"Comma-separated: {', '.join(METHOD_NAMES)}.")] = ",".join(
        METHOD_NAMES
    ),
    lookahead: Annotated[str, typer.Option(help="L values of the single-draft methods.")] = "1,2,3,4",
    multi_lookahead: Annotated[
        str | None, typer.Option(help="L values of mpfr and gls (default: the largest --lookahead).")
    ] = None,
    drafts: Annotated[str, typer.Option(help="B values of mpfr and gls.")] = "2,4,6,8",
    max_new_tokens: Annotated[int, typer.Option(help="Token budget per generation (EOS counts).")] = 128,
    limit: Annotated[
        int | None, typer.Option(help="Use the first N prompts (of each part of builtin).")
    ] = None,
    seeds: Annotated[str, typer.Option(help="Request seeds; each prompt runs once per seed.")] = "0",
    target: Annotated[
        str, typer.Option(help="'embedded', a local model dir, or a cached HF model id.")
    ] = "embedded",
    drafter: Annotated[
        str,
        typer.Option(
            help="Drafters (comma-separated): 'embedded', 'ngram', 'auto', 'target' (the target "
            "itself), a dir or id."
        ),
    ] = "embedded",
    draft_temperature: Annotated[
        str | None, typer.Option(help="Drafter temperatures (comma-separated; default: the target's).")
    ] = None,
    key: Annotated[
        str | None, typer.Option(help="A registry key id (default: a key derived from --key-seed).")
    ] = None,
    key_seed: Annotated[str, typer.Option(help="Derive the evaluation key from this string.")] = "wmark-eval",
    temperature: Annotated[float, typer.Option(help="Target temperature (> 0).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Top-k on both models (0: off).")] = 50,
    top_p: Annotated[float, typer.Option(help="Top-p on both models (1: off).")] = 1.0,
    diversity_bits: Annotated[
        float, typer.Option(help="Unkeyed diversity prefix (bits) of the keyed methods; 0 as in the paper.")
    ] = 0.0,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Apply the target's chat template.")] = True,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "auto",
    summary_only: Annotated[
        bool, typer.Option(help="Rebuild summary.md and plots from results.jsonl only.")
    ] = False,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG figures.")] = True,
    attacks: Annotated[
        str | None,
        typer.Option(
            help="Attack the answers and detect them (attacks.jsonl, attacks.md, attacks.png): names or "
            "groups char, word, span, all (= char, word, span), model (= paraphrase: the target rewrites "
            "each answer, one generation per answer and length; loads the model), comma-separated."
        ),
    ] = None,
    attack_lengths: Annotated[
        str, typer.Option(help="Answer lengths (tokens) the attacks are measured at.")
    ] = ("50,100,200"),
    attack_seed: Annotated[int, typer.Option(help="Seed of the attacks' random edits.")] = 0,
    paraphrase_limit: Annotated[
        int | None,
        typer.Option(
            help="Paraphrase the answers of at most N generations (watermarked ones first), each once "
            "per --attack-lengths value (a paraphrase is a generation of about 1.25x the length)."
        ),
    ] = None,
    negatives: Annotated[
        Path | None,
        typer.Option(
            help="Unwatermarked documents (.jsonl with a 'text' per line, or one document per line, at "
            "least 100): calibrate an empirical 1% threshold on them and report its TPR beside the others."
        ),
    ] = None,
) -> None:
    """Evaluate methods side by side: AATPS, ANLPPT, TPR at 1% FPR, LPPL, ROUGE-L; tables and plots.

    \b
    Examples:
      wmark eval --out runs/smoke --prompts eli5-mini --limit 2 --methods pfr,mse --max-new-tokens 32
      wmark eval --out runs/paper --lookahead 1,2,3,4 --drafts 2,4,6,8
      wmark eval --out runs/drafters --methods pfr,mpfr,mse,mse-pseudo --lookahead 4 --drafts 4 \\
          --drafter embedded,target --draft-temperature 1,0.5,1.5
      wmark eval --out runs/robust --methods pfr,pfr-nowm --lookahead 4 --max-new-tokens 200 --attacks all
      wmark eval --out runs/robust --methods pfr,pfr-nowm --lookahead 4 --max-new-tokens 200 --summary-only \\
          --attacks paraphrase --paraphrase-limit 20 --negatives human.jsonl
    """
    from wmark.eval.attacks import parse_attacks
    from wmark.eval.negatives import read_negatives
    from wmark.eval.session import EvalConfig, EvalInterrupted, EvalSession
    from wmark.eval.summary import eval_tokens

    attack_names = parse_attacks(attacks) if attacks else []
    lengths = _ints("--attack-lengths", attack_lengths)
    if paraphrase_limit is not None and paraphrase_limit < 1:
        raise InputError("--paraphrase-limit must be at least 1")
    negative_docs = read_negatives(negatives) if negatives is not None else None  # fail before generating

    config = EvalConfig(
        out=out,
        prompts=prompts,
        prompt_template=prompt_template,
        limit=limit,
        methods=_names("--methods", methods),
        lookaheads=_ints("--lookahead", lookahead),
        multi_lookaheads=_ints("--multi-lookahead", multi_lookahead) if multi_lookahead else None,
        drafts=_ints("--drafts", drafts),
        drafters=_names("--drafter", drafter),
        draft_temperatures=_floats("--draft-temperature", draft_temperature) if draft_temperature else None,
        seeds=_ints("--seeds", seeds),
        target=target,
        key=key,
        key_seed=key_seed,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        diversity_bits=diversity_bits,
        chat=chat,
        device=device,
        precision=precision,
    )
    session = EvalSession(config)
    if summary_only:
        rows = session.rows()
    else:
        try:
            with _Bars() as bars:
                rows = session.run(bars)
        except EvalInterrupted as exc:
            err_console.print(
                f"interrupted: {exc.new_rows} new rows saved in {escape(str(exc.results))}; "
                "rerun the command to resume"
            )
            raise typer.Exit(130) from None
    thresholds = None
    if negative_docs is not None and rows:
        with err_console.status("calibrating on the negative corpus"):
            at = sorted({*eval_tokens(session.info), *(lengths if attack_names else [])})
            thresholds = session.negative_thresholds(negative_docs, str(negatives), at)
    written = session.write_outputs(rows, plots=plots, negatives=thresholds)
    if attack_names:
        with err_console.status("attacking") as status:
            written += session.write_attacks(
                rows,
                attack_names,
                lengths=lengths,
                seed=attack_seed,
                plots=plots,
                paraphrase_limit=paraphrase_limit,
                negatives=thresholds,
                progress=lambda message: status.update(escape(message)),
            )
    err_console.print(
        f"{len(rows)} rows in {escape(str(session.results.path))}; wrote "
        + ", ".join(p.name for p in written)
    )


class _Bars:
    """`EvalProgress` on stderr: a spinner while models load, then generation and token bars."""

    def __init__(self) -> None:
        self._status: Status | None = None
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._overall: TaskID | None = None
        self._tokens: TaskID | None = None

    def loading(self, message: str) -> None:
        if self._status is None:
            self._status = err_console.status(message)
            self._status.start()
        else:
            self._status.update(message)

    def started(self, jobs: int, max_new_tokens: int) -> None:
        self._stop_status()
        self._progress.start()
        self._overall = self._progress.add_task("generations", total=jobs)
        self._tokens = self._progress.add_task("tokens", total=max_new_tokens)

    def job_started(self, job: Job) -> None:
        assert self._tokens is not None
        self._progress.update(
            self._tokens, completed=0, description=f"{job.prompt.id} {job.setting.key} s{job.seed}"
        )

    def tokens(self, generated: int) -> None:
        assert self._tokens is not None
        self._progress.update(self._tokens, completed=generated)

    def job_done(self, row: EvalRow) -> None:
        del row
        assert self._overall is not None
        self._progress.advance(self._overall)

    def __enter__(self) -> _Bars:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop whichever display is live, however the run ended."""
        self._stop_status()
        self._progress.stop()

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
