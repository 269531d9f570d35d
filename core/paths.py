"""Where wmark keeps its data: `$WMARK_HOME`, else the platform's user data directory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

__all__ = ["data_home"]


def data_home(env: Mapping[str, str] | None = None) -> Path:
    """The data directory (keys database, master key file, model cache)."""
    env = os.environ if env is None else env
    return Path(env.get("WMARK_HOME") or platformdirs.user_data_dir("wmark")).expanduser()
