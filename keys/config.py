"""Where the registry lives: data directory, database URL, master key source, and how long to wait
for the database (from the environment).

Only the edges (CLI, service) build a `RegistryConfig`; library code takes one explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wmark.errors import InputError
from wmark.paths import data_home

__all__ = ["DatabaseTimeouts", "RegistryConfig"]


@dataclass(frozen=True, kw_only=True)
class DatabaseTimeouts:
    """How long the registry waits for its database: one that does not answer is an error (the
    service's 503, the CLI's exit 2) after a bounded time, never a hang (`wmark.keys.db_timeouts`).

    Attributes:
        connect: seconds to open a connection (`WMARK_DB_CONNECT_TIMEOUT`; PostgreSQL counts
            whole seconds, at least 2).
        statement: seconds a statement may run (`WMARK_DB_STATEMENT_TIMEOUT`): PostgreSQL's
            `statement_timeout`, and the client gives up on any answer it has waited for
            `statement + connect` seconds (a server that stopped keeps its connections open);
            SQLite's busy timeout (waiting for another writer's lock).
        pool: seconds to wait for a free connection of the engine's pool (`WMARK_DB_POOL_TIMEOUT`).
    """

    connect: float = 5.0
    statement: float = 30.0
    pool: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DatabaseTimeouts:
        """Read the `WMARK_DB_*_TIMEOUT` variables (seconds, > 0); unset or empty: the defaults."""
        defaults = cls()
        return cls(
            connect=_seconds(env, "WMARK_DB_CONNECT_TIMEOUT", defaults.connect),
            statement=_seconds(env, "WMARK_DB_STATEMENT_TIMEOUT", defaults.statement),
            pool=_seconds(env, "WMARK_DB_POOL_TIMEOUT", defaults.pool),
        )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 < value < 1e6:
        raise InputError(f"{name} must be more than 0 seconds, got {raw!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    """Registry settings.

    Attributes:
        home: data directory (`WMARK_HOME`, default the platform's user data dir); holds the
            default SQLite database, the master key file and cached model files.
        database_url: SQLAlchemy URL (`WMARK_DATABASE_URL`, default SQLite in `home`).
        master_key: the `WMARK_MASTER_KEY` value if set (base64 or hex of 32 bytes), else None
            and the key file `home/master.key` is used (created 0600 on first use).
        timeouts: how long to wait for the database (`WMARK_DB_*_TIMEOUT`).
    """

    home: Path
    database_url: str
    master_key: str | None = None
    timeouts: DatabaseTimeouts = DatabaseTimeouts()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistryConfig:
        """Read `WMARK_HOME`, `WMARK_DATABASE_URL`, `WMARK_MASTER_KEY` and `WMARK_DB_*_TIMEOUT`."""
        env = os.environ if env is None else env
        home = data_home(env)
        url = env.get("WMARK_DATABASE_URL") or f"sqlite:///{home / 'wmark.db'}"
        return cls(
            home=home,
            database_url=url,
            master_key=env.get("WMARK_MASTER_KEY") or None,
            timeouts=DatabaseTimeouts.from_env(env),
        )

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
