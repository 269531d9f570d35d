"""`python -m wmark.cli`."""

from wmark.cli.main import main

main()
