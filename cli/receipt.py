"""`wmark receipt`: publish, rotate and revoke the keys that sign detection receipts, and
verify receipts offline.

`verify` never opens the registry: it needs only the receipt, the public keys (a JWKS document
from `wmark receipt keys --json` or `GET /v1/receipts/keys`) and, optionally, the input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, fail, open_registry, print_json
from wmark.errors import InputError
from wmark.jwk import read_jwks
from wmark.receipts import Verification, verify_receipt

app = typer.Typer(
    help="Signed detection receipts: the signing keys, and offline verification.", no_args_is_help=True
)

EXIT_INVALID = 1
_MAX_FILE = 64 << 20  # a receipt file, a key set, a text or token-ID file read for verification


@app.command("keys")
def keys_cmd(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the public keys as a JWKS document (what verify reads).")
    ] = False,
) -> None:
    """List the signing keys, revoked and retired ones too (public halves only).

    \b
    Examples:
      wmark receipt keys
      wmark receipt keys --json > receipt-keys.json
    """
    with open_registry() as registry:
        infos = registry.receipt_keys.list()
    if as_json:
        print_json({"keys": [i.to_jwk() for i in infos]})
        return
    table = Table("status", "since")
    table.add_column("kid", no_wrap=True)
    for i in infos:
        since = i.revoked_at or i.retired_at or i.created_at
        table.add_row(i.status, f"{since:%Y-%m-%d %H:%M}", i.kid)
    console.print(table)


@app.command()
def rotate() -> None:
    """Sign new receipts with a new key; the old key is retired and its receipts still verify.

    Publish the key set again (`wmark receipt keys --json`) so that verifiers know the new key.
    """
    with open_registry() as registry:
        info = registry.receipt_keys.rotate(actor=cli_actor())
    typer.echo(f"{info.kid} active")


@app.command()
def revoke(
    kid: Annotated[
        str,
        typer.Argument(
            help="The signing key's kid (see `wmark receipt keys`); one that starts with '-' goes after "
            "'--': wmark receipt revoke -- -qYb..."
        ),
    ],
) -> None:
    """Revoke a signing key: every receipt it signed fails verification from then on, saying so.

    Publish the key set again: verifiers learn of the revocation from it. A kid is base64url and
    may start with '-', which the shell parser reads as an option unless it follows '--'.
    """
    with open_registry() as registry:
        info = registry.receipt_keys.revoke(kid, actor=cli_actor())
    typer.echo(f"{info.kid} revoked")


@app.command()
def verify(
    file: Annotated[str, typer.Argument(help="Receipts, one per line, as issued; '-' reads stdin.")],
    public_keys: Annotated[
        Path, typer.Option("--public-keys", "-k", help="JWKS document of the signing keys.")
    ],
    text: Annotated[
        Path | None, typer.Option(help="The text detected: its bytes must be what the receipt hashed.")
    ] = None,
    token_ids: Annotated[
        Path | None,
        typer.Option(
            help="Or the token IDs detected: a JSON list, or a `wmark generate --json` record "
            "(its prompt_ids and token_ids)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON report per receipt.")] = False,
) -> None:
    """Check receipts offline: intact, signed by a published key that is not revoked, and (with
    --text or --token-ids) about that input. Exit 0 if all hold, 1 if one does not.

    \b
    Examples:
      wmark receipt verify answer.receipt --public-keys receipt-keys.json --text answer.txt
      curl -s https://wmark.example/v1/receipts/keys > receipt-keys.json
    """
    if text is not None and token_ids is not None:
        raise fail("give --text or --token-ids, not both")
    keys = read_jwks(_read(str(public_keys)))
    receipts = _receipt_lines(_read(file))
    if len(receipts) > 1 and (text is not None or token_ids is not None):
        raise fail(f"{file} holds {len(receipts)} receipts: --text and --token-ids check one")
    given: dict[str, Any] = {}
    if text is not None:
        given["text"] = _read(str(text))
    if token_ids is not None:
        given["prompt_ids"], given["token_ids"] = _token_ids(_read(str(token_ids)), str(token_ids))
    reports = [verify_receipt(r, keys, **given) for r in receipts]
    for report in reports:
        if as_json:
            print_json(report.to_dict())
        else:
            _print(report)
    if not all(r.ok for r in reports):
        raise typer.Exit(EXIT_INVALID)


def _read(source: str) -> bytes:
    try:
        if source == "-":
            data = sys.stdin.buffer.read(_MAX_FILE + 1)
        else:
            with open(source, "rb") as fh:
                data = fh.read(_MAX_FILE + 1)
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None
    if len(data) > _MAX_FILE:
        raise InputError(f"{source} is over {_MAX_FILE:,} bytes")
    return data


def _receipt_lines(data: bytes) -> list[bytes]:
    """The receipts of a file: one per line; a last line break is optional, an empty line is
    an invalid receipt (it is no receipt's bytes)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise InputError("no receipt: the file is empty")
    return lines


def _token_ids(data: bytes, source: str) -> tuple[list[int] | None, list[int]]:
    """(prompt_ids, token_ids) of a JSON list or a `wmark generate --json` record."""
    try:
        value = json.loads(data)
        if isinstance(value, dict):
            prompt, ids = value.get("prompt_ids"), value["token_ids"]
        else:
            prompt, ids = None, value
        for group in (ids, prompt or []):
            if not isinstance(group, list) or not all(type(i) is int and i >= 0 for i in group):
                raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise InputError(
            f"{source} is neither a JSON list of token IDs nor a record with token_ids"
        ) from None
    return prompt, ids


def _print(report: Verification) -> None:
    payload = report.payload or {}
    if not report.ok:
        console.print(f"[bold red]INVALID[/]: {escape(report.reason)}", highlight=False, soft_wrap=True)
        return
    detection = payload.get("detection", {})
    key = payload.get("key", {})
    console.print(
        f"[green]valid[/]: {escape(str(detection.get('verdict')))} under key {escape(str(key.get('id')))} "
        f"(log p {escape(str(detection.get('log_p')))}), audit row {payload.get('audit_seq')}, "
        f"issued {escape(str(payload.get('issued_at')))} by {escape(str(payload.get('issuer')))} "
        f"with {escape(str(payload.get('kid')))} ({report.key_status})",
        highlight=False,
        soft_wrap=True,
    )
