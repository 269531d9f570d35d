"""Where the registry lives: data directory, database URL, master key source (from the environment).

Only the edges (CLI, service) build a `RegistryConfig`; library code takes one explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wmark.paths import data_home

__all__ = ["RegistryConfig"]


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    """Registry settings.

    Attributes:
        home: data directory (`WMARK_HOME`, default the platform's user data dir); holds the
            default SQLite database, the master key file and cached model files.
        database_url: SQLAlchemy URL (`WMARK_DATABASE_URL`, default SQLite in `home`).
        master_key: the `WMARK_MASTER_KEY` value if set (base64 or hex of 32 bytes), else None
            and the key file `home/master.key` is used (created 0600 on first use).
    """

    home: Path
    database_url: str
    master_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistryConfig:
        """Read `WMARK_HOME`, `WMARK_DATABASE_URL` and `WMARK_MASTER_KEY`."""
        env = os.environ if env is None else env
        home = data_home(env)
        url = env.get("WMARK_DATABASE_URL") or f"sqlite:///{home / 'wmark.db'}"
        return cls(home=home, database_url=url, master_key=env.get("WMARK_MASTER_KEY") or None)

    @property
    def key_file(self) -> Path:
        """The master key file used when `WMARK_MASTER_KEY` is not set."""
        return self.home / "master.key"

    def __repr__(self) -> str:
        master = "<env, redacted>" if self.master_key else str(self.key_file)
        url = _redact_url(self.database_url)
        return f"RegistryConfig(home={str(self.home)!r}, database_url={url!r}, master_key={master})"


def _redact_url(url: str) -> str:
    # postgresql://user:password@host/db -> postgresql://user:***@host/db
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
