"""`wmark eval`: every method side by side on the same prompts -> results.jsonl, summary.md, plots."""

from __future__ import annotations

import dataclasses
import hashlib
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
    TextColumn,
    TimeElapsedColumn,
)

from wmark.cli.common import err_console, open_registry
from wmark.errors import InputError
from wmark.generator.names import METHOD_NAMES
from wmark.keymaterial import KeyMaterial
from wmark.secret import Secret

if TYPE_CHECKING:  # torch, transformers and matplotlib load only when the command runs
    from wmark.eval.rows import EvalRow
    from wmark.eval.runner import EvalModels, Job, ResultsFile, RunInfo
    from wmark.generator.loading import ModelPair

EVAL_KEY_TAG = b"wmark.eval-key.v1"
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


def eval_key_secret(key_seed: str) -> Secret:
    """The evaluation key derived from --key-seed (reproducible runs without a key registry)."""
    return Secret(hashlib.sha256(EVAL_KEY_TAG + key_seed.encode()).digest())


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
            help="Drafters (comma-separated): 'embedded', 'target' (the target itself), a dir or id."
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
    precision: Annotated[
        str, typer.Option(help="auto (int8 on CPU, bf16 on CUDA), int8, exact-fp32, fp32, bf16, fp16.")
    ] = "auto",
    summary_only: Annotated[
        bool, typer.Option(help="Rebuild summary.md and plots from results.jsonl only.")
    ] = False,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG figures.")] = True,
) -> None:
    """Evaluate methods side by side: AATPS, ANLPPT, TPR at 1% FPR, LPPL, ROUGE-L; tables and plots.

    \b
    Examples:
      wmark eval --out runs/smoke --prompts eli5-mini --limit 2 --methods pfr,mse --max-new-tokens 32
      wmark eval --out runs/paper --lookahead 1,2,3,4 --drafts 2,4,6,8
      wmark eval --out runs/drafters --methods pfr,mpfr,mse,mse-pseudo --lookahead 4 --drafts 4 \\
          --drafter embedded,target --draft-temperature 1,0.5,1.5
    """
    from wmark.eval.prompts import load_prompt_set
    from wmark.eval.runner import ResultsFile, RunInfo, expand_settings, plan_jobs

    lookaheads = _ints("--lookahead", lookahead)
    temperatures = _floats("--draft-temperature", draft_temperature) if draft_temperature else [temperature]
    drafters = _names("--drafter", drafter)
    settings = expand_settings(
        _names("--methods", methods),
        lookaheads=lookaheads,
        multi_lookaheads=_ints("--multi-lookahead", multi_lookahead)
        if multi_lookahead
        else [max(lookaheads)],
        drafts=_ints("--drafts", drafts),
        drafters=drafters,
        draft_temperatures=temperatures,
    )
    secret = eval_key_secret(key_seed) if key is None else None
    info = RunInfo(
        target=target,
        key_id=key or f"wk_eval_{hashlib.sha256(key_seed.encode()).hexdigest()[:8]}",
        key_fingerprint=secret.fingerprint() if secret is not None else "",
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        diversity_bits=diversity_bits,
        default_drafter=drafters[0],
        default_draft_temperature=temperatures[0],
        prompts=prompts,
        spec="",
    )
    for setting in settings:
        setting.sampler(info)  # every invalid value fails here, before any model loads
    prompt_set = load_prompt_set(prompts, limit=limit)
    out.mkdir(parents=True, exist_ok=True)
    run_json = out / "run.json"
    info = _resume_info(info, run_json)
    results = ResultsFile(out / "results.jsonl")
    plan = plan_jobs(prompt_set.prompts, settings, _ints("--seeds", seeds))
    if summary_only:
        rows = results.load()
    else:
        with results.locked():
            rows = results.load(repair=True)
            done = {r.row_id for r in rows}
            pending = [j for j in plan if j.row_id not in done]
            if pending:
                info, new = _generate(
                    pending,
                    rows,
                    info,
                    run_json,
                    results,
                    target=target,
                    drafters=drafters,
                    device=device,
                    precision=precision,
                    chat=chat,
                    key=key,
                    secret=secret,
                )
                rows += new
    if not rows:
        raise InputError(f"{out}: no results yet; run without --summary-only first")
    _write_outputs(rows, info, out, plots)


def _generate(
    pending: list[Job],
    rows: list[EvalRow],
    info: RunInfo,
    run_json: Path,
    results: ResultsFile,
    *,
    target: str,
    drafters: list[str],
    device: str,
    precision: str,
    chat: bool,
    key: str | None,
    secret: Secret | None,
) -> tuple[RunInfo, list[EvalRow]]:
    """Load the models and run the pending jobs; a new folder gets its run.json here."""
    from wmark.eval.models import load_models
    from wmark.eval.runner import lppl_key

    with err_console.status("loading models") as status:
        models, pair = load_models(
            target, drafters, device=device, precision=precision, chat=chat, progress=status.update
        )
    models.lppl_cache.update({lppl_key(r.prompt_key, r.token_ids): (r.lppl, r.lppl_dropped) for r in rows})
    material = _key_material(key, secret, info.key_id, pair)
    if not info.spec:
        info = dataclasses.replace(
            info, key_fingerprint=material.secret.fingerprint(), spec=material.spec.to_json()
        )
        info.save(run_json)
    elif info.spec != material.spec.to_json():
        raise InputError(f"{run_json.parent} was made with another key spec (tokenizer): use another --out")
    return info, _run(pending, models, material, info, results)


def _resume_info(info: RunInfo, run_json: Path) -> RunInfo:
    """The run description to use: `info` for a new folder, else the stored one (which must match).

    A folder keeps its first run's default drafter condition, key fingerprint and spec; later
    runs may add methods, settings, drafters, prompts and seeds.
    """
    from wmark.eval.runner import RunInfo

    if not run_json.exists():
        return info
    stored = RunInfo.load(run_json)
    info.check_compatible(stored, run_json.parent)
    return stored


def _key_material(key_id: str | None, secret: Secret | None, derived_id: str, pair: ModelPair) -> KeyMaterial:
    """The registry key (checked against the target's tokenizer) or the derived evaluation key."""
    from wmark.detector import TextTokenizer
    from wmark.generator.engine import check_key_binding
    from wmark.spec import WatermarkSpec

    if key_id is not None:
        with open_registry() as registry:
            material = registry.material(key_id, for_generation=True)
        check_key_binding(material, pair.target)
        return material
    assert secret is not None
    ref = TextTokenizer(pair.tokenizer_json, "target").ref
    return KeyMaterial(key_id=derived_id, secret=secret, spec=WatermarkSpec(tokenizer=ref))


def _run(
    pending: list[Job], models: EvalModels, material: KeyMaterial, info: RunInfo, results: ResultsFile
) -> list[EvalRow]:
    """Generate the pending rows with a progress bar, appending each as soon as it is done."""
    from wmark.eval.runner import run_job

    new: list[EvalRow] = []
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    try:
        with progress:
            overall = progress.add_task("generations", total=len(pending))
            tokens = progress.add_task("tokens", total=info.max_new_tokens)
            for job in pending:
                progress.update(
                    tokens, completed=0, description=f"{job.prompt.id} {job.setting.key} s{job.seed}"
                )
                row = run_job(
                    job,
                    models=models,
                    key=material,
                    info=info,
                    on_block=lambda n: progress.update(tokens, completed=n),
                )
                results.append(row)
                new.append(row)
                progress.advance(overall)
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: {len(new)} new rows saved in {escape(str(results.path))}; "
            "rerun the command to resume"
        )
        raise typer.Exit(130) from None
    return new


def _write_outputs(rows: list[EvalRow], info: RunInfo, out: Path, plots: bool) -> None:
    from wmark.eval.summary import render_summary
    from wmark.spec import WatermarkSpec

    summary = out / "summary.md"
    summary.write_text(render_summary(rows, info, WatermarkSpec.from_json(info.spec)))
    written = [summary]
    if plots:
        from wmark.eval.plots import write_plots

        written += write_plots(rows, info, out)
    err_console.print(
        f"{len(rows)} rows in {escape(str(out / 'results.jsonl'))}; wrote "
        + ", ".join(p.name for p in written)
    )
