"""The web page at `/`: one HTML file with inline CSS and JS, no build step, no external assets.

It is served with a Content-Security-Policy that allows exactly its own inline script and style
(by SHA-256) and requests to this origin, so nothing else can run or be loaded.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


def _csp_hash(block: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(block.encode("utf-8")).digest()).decode() + "'"


@cache
def _page() -> tuple[str, dict[str, str]]:
    html = files("wmark.api").joinpath("static/index.html").read_text(encoding="utf-8")
    scripts = " ".join(_csp_hash(b) for b in re.findall(r"<script>(.*?)</script>", html, re.S))
    styles = " ".join(_csp_hash(b) for b in re.findall(r"<style>(.*?)</style>", html, re.S))
    csp = (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {
        "Content-Security-Policy": csp,
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-cache",
    }
    return html, headers


@router.get("/")
def page() -> HTMLResponse:
    """The detection page."""
    html, headers = _page()
    return HTMLResponse(html, headers=headers)
