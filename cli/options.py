"""Options that several commands share, declared once so that their names and help stay alike."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["KeyIds"]

KeyIds = Annotated[
    list[str] | None,
    typer.Option("--key", "-k", help="Key id to test (repeatable). Default: every active and retired key."),
]
"""`--key/-k`: the keys to test (`KeyRegistry.detection_keys`); None for every active and retired key."""
