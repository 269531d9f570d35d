"""`wmark keys`: create, list, show, rotate and revoke watermark keys; generate a master key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, embedded_tokenizer_loader, open_registry, print_json
from wmark.detector.tokenize import read_tokenizer_source
from wmark.keys import KeyInfo, MasterKey
from wmark.keys.calibrations import Calibration
from wmark.spec import VLLM_SCHEMES
from wmark.vllm_gumbel import GUESSABLE_WARNING, VllmWatermarkConfig

app = typer.Typer(
    help="Manage watermark keys (secrets never leave the registry in clear).", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _show(info: KeyInfo, as_json: bool) -> None:
    if as_json:
        print_json(info.to_dict())
        return
    spec = info.spec
    console.print(f"[bold]{info.key_id}[/]  {escape(info.name)}  ({info.status})", highlight=False)
    console.print(f"  fingerprint   {info.fingerprint}", highlight=False)
    console.print(
        f"  tokenizer     {escape(spec.tokenizer.name)} sha256:{spec.tokenizer.sha256[:12]}"
        f" vocab {spec.tokenizer.vocab_size}",
        highlight=False,
    )
    if spec.is_vllm:
        alpha = f", alpha {spec.dual_key_alpha}" if spec.dual_key_alpha is not None else ""
        console.print(f"  scheme        {spec.scheme} (vLLM's native watermark{alpha})", highlight=False)
    console.print(
        f"  context       {spec.context_mode}, width {spec.context_width}, dedup {spec.dedup}",
        highlight=False,
    )
    console.print(
        f"  spec version  {spec.spec_version}, min scored tokens {spec.min_scored_tokens}", highlight=False
    )
    console.print(f"  created       {info.created_at:%Y-%m-%d %H:%M:%S}Z", highlight=False)
    if info.rotated_at:
        console.print(
            f"  rotated       {info.rotated_at:%Y-%m-%d %H:%M:%S}Z -> {info.replaced_by}", highlight=False
        )
    if info.revoked_at:
        console.print(f"  revoked       {info.revoked_at:%Y-%m-%d %H:%M:%S}Z", highlight=False)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="A name for the key (e.g. the model or product it marks).")],
    tokenizer: Annotated[
        str,
        typer.Option(
            help="'embedded' (the default model pair's), a tokenizer.json path, or a local HF model dir."
        ),
    ] = "embedded",
    context_width: Annotated[
        int, typer.Option(min=1, max=16, help="Previous tokens hashed into each position's label.")
    ] = 4,
    scheme: Annotated[
        str,
        typer.Option(
            help="'wmark' (a fresh key for wmark's generator), or 'vllm-gumbel' / 'vllm-dual-key-gumbel' "
            "to register a vLLM deployment's key and detect its native watermark."
        ),
    ] = "wmark",
    watermark_config: Annotated[
        str | None,
        typer.Option(
            help="With a vLLM scheme: the JSON given to vLLM's --watermark-config (with its secret "
            "'key'), or @FILE to read it from a file (keeps the key out of shell history)."
        ),
    ] = None,
    context_mode: Annotated[
        str,
        typer.Option(
            help="'window' (default) or 'prefix' (paper replication: detect with the prompt, "
            "`wmark detect --generation`)."
        ),
    ] = "window",
    min_scored_tokens: Annotated[
        int, typer.Option(min=1, help="Fewer scored tokens than this give 'insufficient_evidence'.")
    ] = 16,
    as_json: JsonOpt = False,
) -> None:
    """Create a key with a fresh random secret, or register a vLLM deployment's key; prints its id."""
    config = _vllm_config(scheme, watermark_config)
    data, tok_name = read_tokenizer_source(tokenizer, embedded=embedded_tokenizer_loader())
    with open_registry() as registry:
        ref = registry.add_tokenizer(data, tok_name)
        if config is not None:
            info = registry.import_vllm_key(
                name, ref, config, min_scored_tokens=min_scored_tokens, actor=cli_actor()
            )
            if config.guessable:
                typer.echo(f"warning: {GUESSABLE_WARNING}", err=True)
        else:
            info = registry.create_key(
                name,
                ref,
                context_width=context_width,
                context_mode=context_mode,
                min_scored_tokens=min_scored_tokens,
                actor=cli_actor(),
            )
    if as_json:
        print_json(info.to_dict())
    else:
        typer.echo(info.key_id)


def _vllm_config(scheme: str, watermark_config: str | None) -> VllmWatermarkConfig | None:
    """The vLLM config of `--scheme`/`--watermark-config`, or None for a wmark key."""
    if scheme == "wmark":
        if watermark_config is not None:
            raise typer.BadParameter("only with --scheme vllm-gumbel or vllm-dual-key-gumbel")
        return None
    if scheme not in VLLM_SCHEMES:
        raise typer.BadParameter(f"one of wmark, {', '.join(VLLM_SCHEMES)}", param_hint="--scheme")
    if watermark_config is None:
        raise typer.BadParameter("a vLLM scheme needs vLLM's config", param_hint="--watermark-config")
    text = watermark_config
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {text[1:]}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc.msg}", param_hint="--watermark-config") from None
    if not isinstance(raw, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--watermark-config")
    raw.setdefault("algorithm", "dual_key_gumbel" if scheme == "vllm-dual-key-gumbel" else "gumbel")
    config = VllmWatermarkConfig.from_dict(raw)
    if config.scheme != scheme:
        raise typer.BadParameter(f"the config's algorithm {config.algorithm!r} is not scheme {scheme}")
    return config


@app.command("list")
def list_keys(
    status: Annotated[
        str | None, typer.Option(help="Only keys with this status: active, retired or revoked.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys, oldest first."""
    if status not in (None, "active", "retired", "revoked"):
        raise typer.BadParameter("status must be active, retired or revoked", param_hint="--status")
    infos = open_registry().list_keys(status)  # type: ignore[arg-type]  # checked above
    if as_json:
        for info in infos:
            print_json(info.to_dict())
        return
    table = Table("key id", "name", "status", "fingerprint", "tokenizer", "h", "created")
    for i in infos:
        table.add_row(
            i.key_id,
            Text(i.name),  # names are the user's: their brackets are not markup
            i.status,
            i.fingerprint,
            Text(i.spec.tokenizer.name),
            str(i.spec.context_width),
            f"{i.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


@app.command()
def show(key_id: Annotated[str, typer.Argument(help="The key's id.")], as_json: JsonOpt = False) -> None:
    """Show one key (never its secret) and its newest calibration (`wmark calibrate`)."""
    with open_registry() as registry:
        info, calibration = registry.get(key_id), registry.calibrations.latest(key_id)
    if as_json:
        print_json({**info.to_dict(), "calibration": calibration.to_dict() if calibration else None})
        return
    _show(info, False)
    _show_calibration(calibration)


def _show_calibration(c: Calibration | None) -> None:
    if c is None:
        console.print(
            "  calibrated    never (wmark calibrate --key KEY CORPUS)", highlight=False, soft_wrap=True
        )
        return
    fpr = c.report.get("fpr", {})
    ks = c.report.get("uniformity", {})
    stale = "  [yellow]stale: the spec changed since[/]" if c.stale else ""
    console.print(
        f"  calibrated    {c.created_at:%Y-%m-%d %H:%M:%S}Z on corpus sha256:{c.corpus_sha256[:12]}{stale}",
        highlight=False,
        soft_wrap=True,
    )
    interval = f", CI [{fpr['ci_low']:.4f}, {fpr['ci_high']:.4f}]" if "ci_low" in fpr else ""
    rate = f"{c.n_flagged / c.n_scored:.4f}" if c.n_scored else "-"
    ks_p = f", one-sided KS p {ks['p_value']:.3g}" if ks.get("p_value") is not None else ""
    console.print(
        f"  FPR           {rate} at alpha {c.alpha} ({c.n_flagged} of {c.n_scored}){interval}{ks_p}",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def rotate(
    key_id: Annotated[str, typer.Argument(help="The active key to replace.")], as_json: JsonOpt = False
) -> None:
    """Replace a key with a new one; the old key is retired (still detected). Prints the new id."""
    with open_registry() as registry:
        info = registry.rotate(key_id, actor=cli_actor())
    if as_json:
        print_json(info.to_dict())
    else:
        typer.echo(info.key_id)


@app.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key to revoke.")], as_json: JsonOpt = False
) -> None:
    """Revoke a key: it neither generates nor detects any more."""
    with open_registry() as registry:
        info = registry.revoke(key_id, actor=cli_actor())
    _show(info, as_json)


@app.command("master-key")
def master_key() -> None:
    """Print a new random master key (base64 of 32 bytes) for WMARK_MASTER_KEY; touches no registry.

    \b
    Set it before the registry's first key: secrets are sealed under the master key the registry
    was created with, and a registry refuses to write under any other.
      export WMARK_MASTER_KEY=$(wmark keys master-key)
    """
    typer.echo(MasterKey.generate())
