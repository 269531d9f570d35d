"""`wmark demo`: the whole loop on the embedded models, from nothing to two verdicts."""

from __future__ import annotations

import codecs
import contextlib
import io
from typing import Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from wmark.cli.common import console, open_registry, print_json
from wmark.cli.generate import load_with_status, run_generation
from wmark.detector import Detector
from wmark.generator.models.embedded import embedded_tokenizer_json
from wmark.generator.names import AUTO, DRAFTER_HELP, PRECISION_HELP
from wmark.keymaterial import KeyMaterial
from wmark.keys import KeyRegistry

DEMO_PROMPT = "Explain like I'm five: why is the sky blue?"
DEMO_KEY_NAME = "demo"


def human_control() -> str:
    """The Zen of Python (Tim Peters): human-written text shipped with every Python."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def demo_key(registry: KeyRegistry) -> KeyMaterial:
    """The active key named 'demo' on the embedded tokenizer, created on first use."""
    ref = registry.add_tokenizer(embedded_tokenizer_json(), "qwen2.5-coder")
    for info in registry.list_keys("active"):
        if info.name == DEMO_KEY_NAME and info.spec.tokenizer.sha256 == ref.sha256:
            return registry.material(info.key_id, for_generation=True)
    return registry.material(registry.create_key(DEMO_KEY_NAME, ref).key_id, for_generation=True)


def demo(
    prompt: Annotated[str, typer.Option(help="What to ask the embedded model.")] = DEMO_PROMPT,
    max_new_tokens: Annotated[int, typer.Option(help="Token budget of the answer.")] = 128,
    seed: Annotated[int | None, typer.Option(help="Make the run reproducible.")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "auto",
    drafter: Annotated[str, typer.Option(help=f"Drafter: {DRAFTER_HELP}")] = AUTO,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of the report.")
    ] = False,
) -> None:
    """Generate a watermarked answer with the embedded models (mpfr), detect it and a human text."""
    from wmark.generator.engine import SamplerConfig

    with open_registry() as registry:
        key = demo_key(registry)
        pair, draft = load_with_status("embedded", drafter, device, precision)
        config = SamplerConfig(method="mpfr", max_new_tokens=max_new_tokens)
        result = run_generation(pair, draft, pair.encode_prompt(prompt), config, key, seed, quiet=as_json)
        detector = Detector(registry.detection_keys([key.key_id]), registry.tokenizer_json)
        generated = detector.detect(result.text, source="generated answer")
        control = detector.detect(human_control(), source="human control (Zen of Python)")
    if as_json:
        print_json(
            {
                "prompt": prompt,
                "key_id": key.key_id,
                "generation": result.to_dict(),
                "detections": [
                    generated.to_dict(include_tokens=False),
                    control.to_dict(include_tokens=False),
                ],
            }
        )
        return
    console.print(Panel(result.text, title=f"[bold]{prompt}[/]", subtitle=f"watermarked with {key.key_id}"))
    table = Table("text", "verdict", "p-value", "scored tokens")
    for det in (generated, control):
        colour = "green" if det.verdict == "watermarked" else "yellow"
        p = f"{det.p_value:.2e}" if det.p_value > 0 else f"e^{det.log_p:.0f}"
        table.add_row(det.source or "", f"[{colour}]{det.verdict}[/]", p, str(det.n_scored))
    console.print(table)
    t = result.timings
    console.print(
        f"{len(result.token_ids)} tokens in {len(result.blocks)} target forwards: AATPS {result.aatps:.2f}, "
        f"{result.tokens_per_s:.2f} tokens/s (prefill {t.prefill:.1f}s, draft {t.draft:.1f}s, "
        f"verify {t.verify:.1f}s, bookkeeping {t.bookkeeping:.1f}s)",
        highlight=False,
    )
