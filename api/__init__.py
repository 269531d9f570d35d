"""wmark.api: the detection service (FastAPI app factory `create_app`).

Run it with `wmark serve` or `uvicorn --factory wmark.api:create_app`.
"""

from __future__ import annotations

from wmark.api.app import create_app
from wmark.api.settings import Settings

__all__ = ["Settings", "create_app"]
