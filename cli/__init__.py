"""wmark.cli: the `wmark` command (Typer). Thin: parse, call a library function, render."""
