"""The public surface changes only on purpose."""

from __future__ import annotations

import wmark
import wmark.detector


def test_core_exports_are_exactly_the_public_names():
    public = {
        n for n in dir(wmark) if not n.startswith("_") and not isinstance(getattr(wmark, n), type(wmark))
    }
    assert set(wmark.__all__) - {"__version__"} == public - {"annotations"}


def test_detector_exports_are_exactly_the_public_names():
    public = {
        n
        for n in dir(wmark.detector)
        if not n.startswith("_") and not isinstance(getattr(wmark.detector, n), type(wmark))
    }
    assert set(wmark.detector.__all__) == public - {"annotations"}


def test_core_imports_no_heavy_framework():
    import subprocess
    import sys

    code = (
        "import sys, wmark, wmark.prf, wmark.scoring, wmark.race, wmark.contexts; "
        "heavy = ('torch', 'transformers', 'fastapi', 'sqlalchemy', 'typer'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
