"""`wmark generate`: watermarked text from a target model, sped up by a drafter."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from wmark.cli.common import err_console, open_registry, print_json
from wmark.errors import InputError
from wmark.generator.names import (
    DEFAULT_DRAFT_CONFIDENCE,
    DEFAULT_LOOKAHEAD,
    DRAFTER_HELP,
    METHOD_NAMES,
    PRECISION_HELP,
)
from wmark.keymaterial import KeyMaterial

if TYPE_CHECKING:  # torch and transformers load only when a command generates
    from wmark.generator.backend import LanguageModel
    from wmark.generator.engine import SamplerConfig
    from wmark.generator.models.loading import ModelPair
    from wmark.generator.result import GenerationResult


def load_with_status(
    target: str, drafter: str | None, device: str, precision: str
) -> tuple[ModelPair, LanguageModel | None]:
    """`load_pair` with a spinner on stderr, and the drafter `drafter` names (None: no drafter)."""
    from wmark.generator.drafters.build import build_drafter, drafter_model_source
    from wmark.generator.models.loading import load_pair

    model = None if drafter is None else drafter_model_source(drafter, target)
    with err_console.status("loading models") as status:
        pair = load_pair(
            target, model, device=device, precision=precision, progress=lambda msg: status.update(msg)
        )
    return pair, None if drafter is None else build_drafter(drafter, pair.target, pair.drafter)


def run_generation(
    pair: ModelPair,
    drafter: LanguageModel | None,
    prompt_ids: list[int],
    config: SamplerConfig,
    key: KeyMaterial | None,
    seed: int | None,
    *,
    quiet: bool = False,
    stream: bool = False,
) -> GenerationResult:
    """Generate with a progress bar on stderr (tokens so far over the budget), or, with
    `stream`, printing the text to stdout block by block as it comes (`TextStream`: never a
    broken character; the whole text ends with a newline), a spinner on stderr until the first
    block."""
    from wmark.generator.engine import generate

    def run(
        on_emit: Callable[[Sequence[int]], None] | None = None, on_block: Callable[[int], None] | None = None
    ) -> GenerationResult:
        return generate(
            pair.target,
            prompt_ids,
            config=config,
            key=key,
            drafter=drafter,
            seed=seed,
            decode=pair.decode,
            on_emit=on_emit,
            on_block=on_block,
        )

    if stream:
        from wmark.generator.text_stream import TextStream

        text = TextStream(pair.decode)
        # the prompt's prefill comes before any text (seconds for a long prompt on a CPU): a
        # spinner on stderr until the first block, stopped before anything is printed
        waiting = err_console.status(f"reading the prompt ({len(prompt_ids)} tokens)")
        if not quiet:
            waiting.start()

        def emit(ids: Sequence[int]) -> None:
            waiting.stop()
            _show(text.delta(ids))

        try:
            result = run(on_emit=emit)
        finally:
            waiting.stop()
        _show(text.rest(result.text) + "\n")
        return result
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} tokens"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet,
    )
    with progress:
        task = progress.add_task(f"generating ({config.method})", total=config.max_new_tokens)
        return run(on_block=lambda n: progress.update(task, completed=n))


def _show(piece: str) -> None:
    """Print a piece of streamed text now (stdout is line- or block-buffered)."""
    if piece:
        sys.stdout.write(piece)
        sys.stdout.flush()


def generate_cmd(
    prompt: Annotated[str | None, typer.Argument(help="The prompt (or use --prompt-file).")] = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="Read the prompt from this UTF-8 file ('-' for stdin).")
    ] = None,
    chat: Annotated[
        bool, typer.Option("--chat/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    key: Annotated[str | None, typer.Option(help="Key id (default: the only active key).")] = None,
    method: Annotated[str, typer.Option(help=f"Sampler: {', '.join(METHOD_NAMES)}.")] = "mpfr",
    drafts: Annotated[int | None, typer.Option(help="B, drafts per block (mpfr; default 3).")] = None,
    lookahead: Annotated[int, typer.Option(help="L, draft depth per block.")] = DEFAULT_LOOKAHEAD,
    max_new_tokens: Annotated[int, typer.Option(help="Token budget (EOS counts).")] = 128,
    temperature: Annotated[float, typer.Option(help="Target temperature (> 0).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Top-k on both models (0: off).")] = 50,
    top_p: Annotated[float, typer.Option(help="Top-p on both models (1: off).")] = 1.0,
    draft_temperature: Annotated[
        float | None, typer.Option(help="Drafter temperature (default: the target's).")
    ] = None,
    draft_confidence: Annotated[
        float,
        typer.Option(
            help="Dynamic lookahead (pfr, pfr-nowm, mpfr, gls): end a draft branch below this drafter"
            " probability (0: off). vsps, mws, mse and mse-pseudo always draft L tokens, as their papers do."
        ),
    ] = DEFAULT_DRAFT_CONFIDENCE,
    lookup_lookahead: Annotated[
        int,
        typer.Option(
            help="Lookup drafts (ngram, auto) go on past L to this depth while the text matches (0: off)."
        ),
    ] = 0,
    diversity_bits: Annotated[
        float, typer.Option(help="Unkeyed prefix so equal prompts differ (bits; 0: off).")
    ] = 16.0,
    seed: Annotated[int | None, typer.Option(help="Make the unkeyed randomness reproducible.")] = None,
    target: Annotated[
        str, typer.Option(help="'embedded', a local model dir, or a cached HF model id.")
    ] = "embedded",
    drafter: Annotated[str, typer.Option(help=f"Drafter: {DRAFTER_HELP}")] = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "auto",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text, token_ids, blocks, aatps, ...).")
    ] = False,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream",
            help="Print the text as it is generated (default: when stdout is a terminal and not --json).",
        ),
    ] = None,
) -> None:
    """Generate watermarked text (exactly the target's distribution; the drafter only speeds it up).

    \b
    Examples:
      wmark generate "Explain like I'm five: why is the sky blue?"
      wmark generate --method pfr --lookahead 4 --seed 7 --json "Write a haiku about rain"
    """
    if stream and as_json:
        raise InputError("--stream prints the text as it comes, --json one object at the end: choose one")
    if stream is None:
        stream = not as_json and sys.stdout.isatty()
    if prompt is None and prompt_file is None:
        raise InputError("give a PROMPT or --prompt-file")
    if prompt is not None and prompt_file is not None:
        raise InputError("give a PROMPT or --prompt-file, not both")
    if prompt_file is not None:
        raw = sys.stdin.buffer.read() if str(prompt_file) == "-" else _read_file(prompt_file)
        try:
            prompt = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{prompt_file} is not UTF-8 text") from exc
    assert prompt is not None
    if not prompt.strip():
        raise InputError("the prompt is empty")
    from wmark.generator.engine import METHODS, SamplerConfig
    from wmark.generator.logits import LogitsConfig

    config = SamplerConfig(
        method=method,
        lookahead=lookahead,
        drafts=drafts,
        max_new_tokens=max_new_tokens,
        diversity_bits=diversity_bits,
        draft_confidence=draft_confidence,
        lookup_lookahead=lookup_lookahead,
        target_logits=LogitsConfig(temperature=temperature, top_k=top_k, top_p=top_p),
        draft_logits=LogitsConfig(temperature=draft_temperature or temperature, top_k=top_k, top_p=top_p),
    )
    spec = METHODS[method]
    material = None
    if spec.keyed:
        with open_registry() as registry:
            material = registry.generation_key(key)
    pair, draft = load_with_status(target, drafter if spec.speculative else None, device, precision)
    result = run_generation(
        pair,
        draft,
        pair.encode_prompt(prompt, chat=chat),
        config,
        material,
        seed,
        quiet=as_json,
        stream=stream,
    )
    if as_json:
        print_json(result.to_dict())
        return
    if not stream:
        typer.echo(result.text)
    err_console.print(
        f"[dim]{len(result.token_ids)} tokens, {result.method}, key {result.key_id or '-'}, "
        f"AATPS {result.aatps:.2f}, {result.tokens_per_s:.2f} tokens/s[/]",
        highlight=False,
    )


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
