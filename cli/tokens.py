"""`wmark tokens`: create, list and revoke API tokens of the detection service."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from wmark.cli.audit import cli_actor
from wmark.cli.common import console, err_console, open_registry, print_json
from wmark.keys.tokens import ROLES

app = typer.Typer(help="Manage API tokens (shown once, stored hashed).", no_args_is_help=True)


@app.command()
def create(
    role: Annotated[str, typer.Option(help=f"One of: {', '.join(ROLES)} (admin may do everything).")],
    name: Annotated[str, typer.Option(help="A label (who or what uses the token).")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print id, role and token as JSON.")] = False,
) -> None:
    """Create a token and print it once: it cannot be shown again.

    \b
    Examples:
      wmark tokens create --role detector --name moderation-bot
      TOKEN=$(wmark tokens create --role auditor)
    """
    if role not in ROLES:
        raise typer.BadParameter(f"must be one of {', '.join(ROLES)}", param_hint="--role")
    with open_registry() as registry:
        issued = registry.tokens.create(role, name, actor=cli_actor())
    if as_json:
        print_json({**issued.info.to_dict(), "token": issued.token})
    else:
        typer.echo(issued.token)
    err_console.print(
        f"token {issued.info.token_id} ({issued.info.role}) created; store it now, it is not shown again",
        highlight=False,
    )


@app.command("list")
def list_tokens(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per token.")] = False,
) -> None:
    """List tokens (ids, names, roles; never the tokens)."""
    with open_registry() as registry:
        infos = registry.tokens.list()
    if as_json:
        for info in infos:
            print_json(info.to_dict())
        return
    table = Table("token id", "name", "role", "created", "by", "revoked")
    for i in infos:
        table.add_row(
            i.token_id,
            Text(i.name),  # names and actors are the user's: their brackets are not markup
            i.role,
            f"{i.created_at:%Y-%m-%d %H:%M}",
            Text(i.created_by),
            f"{i.revoked_at:%Y-%m-%d %H:%M}" if i.revoked_at else "",
        )
    console.print(table)


@app.command()
def revoke(token_id: Annotated[str, typer.Argument(help="The token's id (the part after wmt_).")]) -> None:
    """Revoke a token: requests with it get 401 from then on."""
    with open_registry() as registry:
        info = registry.tokens.revoke(token_id, actor=cli_actor())
    typer.echo(f"{info.token_id} revoked")
