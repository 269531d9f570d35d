"""`wmark detect`: is this text watermarked with one of our keys?"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, err_console, fail, open_registry, print_json
from wmark.cli.options import KeyIds
from wmark.detector import Detection, Detector
from wmark.detector.checks import check_unicode
from wmark.detector.receipt import detection_claims
from wmark.errors import InputError
from wmark.keys.audit import detection_entry, text_digest
from wmark.keys.calibrations import warning_line
from wmark.keys.receipt_keys import default_issuer
from wmark.keys.registry import no_usable_key
from wmark.receipts import text_sha256, token_ids_sha256

DEFAULT_MAX_BYTES = 4 << 20
# Detection holds about 130 bytes (tokens, scores, windows) per byte of text at its peak
# (measured: +140 MB for 1 MiB, +530 MB for 4 MiB), so an input is bounded before it is read
# whole; `wmark scan` takes stores of many documents.


def _read(source: str, max_bytes: int) -> str:
    """The text of a file or stdin ("-"), read no further than `max_bytes` + 1 bytes."""
    if source == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
        label = "stdin"
    else:
        path = Path(source)
        if path.is_dir():
            raise InputError(
                f"{source} is a directory: scan a folder with `wmark scan {source} --out results.jsonl`"
            )
        try:
            with path.open("rb") as fh:  # also a pipe or a device: read, never stat'ed for size
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise InputError(f"{source}: no such file") from None
        except OSError as exc:
            raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from exc
        label = source
    if len(data) > max_bytes:
        raise InputError(
            f"{label} is over the {max_bytes:,}-byte limit of --max-bytes: "
            "raise it, or split the text and use `wmark scan`"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label} is not UTF-8 text (byte {exc.start} is invalid)") from exc
    if not text.strip():
        raise InputError(f"{label} is empty: there is no text to test")
    return text


def _read_generation(source: str, max_bytes: int) -> tuple[list[int], list[int], str]:
    """(prompt_ids, token_ids, text) of a `wmark generate --json` record."""
    try:
        record = json.loads(_read(source, max_bytes))
        prompt, tokens, text = record["prompt_ids"], record["token_ids"], record["text"]
    except RecursionError:  # the parser's own depth guard: a hostile record, not a crash
        raise InputError(
            f"{source} is not the output of `wmark generate --json` (JSON nested too deeply)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{source} is not the output of `wmark generate --json` ({exc})") from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise InputError(f"{source} is not the output of `wmark generate --json` (number too long)") from None
    ids = [*prompt, *tokens] if isinstance(prompt, list) and isinstance(tokens, list) else [None]
    if not tokens or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in ids):
        raise InputError(f"{source}: prompt_ids and token_ids must be lists of token IDs (answer not empty)")
    if not isinstance(text, str):
        raise InputError(f"{source}: text must be a string")
    try:
        check_unicode(text)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    return list(prompt), list(tokens), text


def detect(
    files: Annotated[
        list[str] | None, typer.Argument(help="Text files to check; '-' or nothing reads stdin.")
    ] = None,
    generation: Annotated[
        list[str] | None,
        typer.Option(
            "--generation",
            "-g",
            help="A `wmark generate --json` record to check by its token IDs, prompt included "
            "(what prefix-mode keys need; exact for any key). Repeatable; instead of FILES.",
        ),
    ] = None,
    key: KeyIds = None,
    alpha: Annotated[
        float, typer.Option(help="Significance level, family-wise over the keys tested.")
    ] = 0.01,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per input on stdout.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 unless every input is watermarked.")] = False,
    max_bytes: Annotated[
        int,
        typer.Option(
            help="Largest input in bytes, per file or stdin (default 4 MiB); a larger one is exit 2. "
            "Detection needs about 130 bytes of memory per byte of text.",
            min=1,
        ),
    ] = DEFAULT_MAX_BYTES,
    receipt: Annotated[
        Path | None,
        typer.Option(
            "--receipt",
            help="Write a signed receipt of each verdict to this file, one per line in input order "
            "(check one offline with `wmark receipt verify`).",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Detect the watermark in text files, with exact p-values (no model needed); each answer is audited.

    \b
    Examples:
      wmark detect answer.txt
      cat answer.txt | wmark detect --json
      wmark detect a.txt b.txt --key wk_3f9a1c2b7d4e --alpha 0.001
      wmark generate --json "Why is the sky blue?" > gen.json && wmark detect --generation gen.json
      wmark detect answer.txt --receipt answer.receipt
    """
    if not 0.0 < alpha < 1.0:
        raise fail(f"--alpha must be between 0 and 1, got {alpha}")
    if files and generation:
        raise fail("give text FILES or --generation records, not both")
    sources = generation or files or ["-"]
    records = [_read_generation(s, max_bytes) for s in generation or []]
    # All inputs are checked before any work is done.
    texts = [text for *_, text in records] if generation else [_read(s, max_bytes) for s in sources]
    with open_registry() as registry:
        keys, skipped = registry.open_detection_keys(key)
        if skipped and not keys:
            raise no_usable_key(skipped, requested=bool(key))
        for left_out in skipped:  # one key sealed under another master key does not stop the others
            err_console.print(
                f"[yellow]warning:[/] {escape(f'key {left_out.key_id} left out: {left_out.message}')}",
                highlight=False,
                soft_wrap=True,
            )
        detector = Detector(keys, registry.tokenizer_json)
        labels = [s if s != "-" else "stdin" for s in sources]
        if generation:
            results = [
                detector.detect(token_ids=[*p, *t], start=len(p), alpha=alpha, source=label)
                for (p, t, _), label in zip(records, labels, strict=True)
            ]
        else:
            results = [detector.detect(t, alpha=alpha, source=s) for s, t in zip(labels, texts, strict=True)]
        actor, tested = cli_actor(), [k.key_id for k in detector.keys]
        unmeasured = warning_line(registry.calibrations.states(tested))
        rows = registry.audit.append(  # one row per input, like the service; the text itself is never stored
            *(
                detection_entry(
                    actor=actor,
                    key_ids=tested,
                    text_sha256=text_digest(t),
                    detection=r.to_dict(include_tokens=False),
                )
                for t, r in zip(texts, results, strict=True)
            )
        )
        if receipt is not None:
            signer = registry.receipt_keys.signer(default_issuer(), actor=actor)
            inputs = (
                [_generation_input(p, t) for p, t, _ in records]
                if generation
                else [("text", text_sha256(t)) for t in texts]
            )
            lines = [
                signer.sign(
                    detection_claims(r, detector.keys, input_kind=kind, input_sha256=digest),
                    audit_seq=row.seq,
                )
                for r, (kind, digest), row in zip(results, inputs, rows, strict=True)
            ]
            _write_receipts(receipt, lines)
    if unmeasured is not None:
        err_console.print(f"[yellow]warning:[/] {escape(unmeasured)}", highlight=False, soft_wrap=True)
    if as_json:
        for r in results:
            print_json(r.to_dict(include_tokens=False))
    else:
        _table(results)
    if check and any(r.verdict != "watermarked" for r in results):
        raise typer.Exit(1)


def _generation_input(prompt: list[int], tokens: list[int]) -> tuple[str, str]:
    """The input kind and SHA-256 a receipt gives a `--generation` record (its token IDs)."""
    if prompt:
        return "prompt_and_token_ids", token_ids_sha256(tokens, prompt)
    return "token_ids", token_ids_sha256(tokens)


def _write_receipts(path: Path, lines: list[str]) -> None:
    try:
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--receipt {path}: cannot write ({exc.strerror or exc})") from None


def _table(results: list[Detection]) -> None:
    colour = {"watermarked": "green", "not_detected": "yellow", "insufficient_evidence": "dim"}
    table = Table("source", "verdict", "p-value", "scored / tokens", "key")
    for r in results:
        table.add_row(
            Text(r.source or ""),  # a file name: its brackets are not markup
            f"[{colour[r.verdict]}]{r.verdict}[/]",
            f"{r.p_value:.3g}" if r.p_value > 0 else f"e^{r.log_p:.1f}",
            f"{r.n_scored} / {r.n_tokens}",
            r.key_id,
        )
    console.print(table)
