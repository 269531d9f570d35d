"""`wmark detect`: is this text watermarked with one of our keys?"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, fail, open_registry, print_json
from wmark.detector import Detection, Detector
from wmark.errors import InputError
from wmark.keys.audit import detection_entry, text_digest


def _read(source: str) -> str:
    if source == "-":
        data = sys.stdin.buffer.read()
        label = "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"{source}: no such file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"{source}: cannot read ({exc.strerror})") from exc
        label = source
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label} is not UTF-8 text (byte {exc.start} is invalid)") from exc
    if not text.strip():
        raise InputError(f"{label} is empty")
    return text


def detect(
    files: Annotated[
        list[str] | None, typer.Argument(help="Text files to check; '-' or nothing reads stdin.")
    ] = None,
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key", "-k", help="Key id to test (repeatable). Default: every active and retired key."
        ),
    ] = None,
    alpha: Annotated[
        float, typer.Option(help="Significance level, family-wise over the keys tested.")
    ] = 0.01,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per input on stdout.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 unless every input is watermarked.")] = False,
) -> None:
    """Detect the watermark in text files, with exact p-values (no model needed); each answer is audited.

    \b
    Examples:
      wmark detect answer.txt
      cat answer.txt | wmark detect --json
      wmark detect a.txt b.txt --key wk_3f9a1c2b7d4e --alpha 0.001
    """
    if not 0.0 < alpha < 1.0:
        raise fail(f"--alpha must be between 0 and 1, got {alpha}")
    sources = files or ["-"]
    texts = [_read(s) for s in sources]  # all inputs are checked before any work is done
    with open_registry() as registry:
        detector = Detector(registry.detection_keys(key), registry.tokenizer_json)
        results = [
            detector.detect(t, alpha=alpha, source=s if s != "-" else "stdin")
            for s, t in zip(sources, texts, strict=True)
        ]
        actor, tested = cli_actor(), [k.key_id for k in detector.keys]
        registry.audit.append(  # one row per input, like the service; the text itself is never stored
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
    if as_json:
        for r in results:
            print_json(r.to_dict(include_tokens=False))
    else:
        _table(results)
    if check and any(r.verdict != "watermarked" for r in results):
        raise typer.Exit(1)


def _table(results: list[Detection]) -> None:
    colour = {"watermarked": "green", "not_detected": "yellow", "insufficient_evidence": "dim"}
    table = Table("source", "verdict", "p-value", "scored / tokens", "key")
    for r in results:
        table.add_row(
            r.source or "",
            f"[{colour[r.verdict]}]{r.verdict}[/]",
            f"{r.p_value:.3g}" if r.p_value > 0 else f"e^{r.log_p:.1f}",
            f"{r.n_scored} / {r.n_tokens}",
            r.key_id,
        )
    console.print(table)
