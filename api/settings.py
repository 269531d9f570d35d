"""Service settings, read from the environment by `Settings.from_env()` (never at import time).

`WMARK_HOME`, `WMARK_DATABASE_URL` and `WMARK_MASTER_KEY` locate the registry as for the CLI;
the `WMARK_API_*` variables set the service's limits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from wmark.errors import InputError
from wmark.keys import RegistryConfig
from wmark.keys.receipt_keys import default_issuer

__all__ = ["SERVE_PID_ENV", "Settings"]

SERVE_PID_ENV = "WMARK_SERVE_PID"  # set by `wmark serve` for its workers (cli names it, not imports it)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    """The number in variable `name` (`default` when unset or empty); InputError below `minimum`."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name} must be a number, got {raw!r}") from None
    if not value >= minimum:
        raise InputError(f"{name} must be at least {minimum}, got {raw!r}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw not in _TRUE | _FALSE:
        raise InputError(f"{name} must be 1/0, true/false, yes/no or on/off, got {raw!r}")
    return raw in _TRUE


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the service needs to start.

    Attributes:
        registry: where the keys database and master key are.
        migrate: migrate the schema on start-up (`WMARK_API_MIGRATE`; `wmark serve` migrates once
            before starting its workers, so this stays off there).
        max_body_bytes: largest request body accepted, else 413 (`WMARK_API_MAX_BODY_BYTES`).
        body_timeout: seconds a request body may take to arrive, else 408 and the connection is
            closed (`WMARK_API_BODY_TIMEOUT`).
        max_text_chars: longest text (or token-ID list) per item, else 413 (`WMARK_API_MAX_TEXT_CHARS`).
        max_request_chars: characters (or token IDs) of all items of one request together, else
            413: with the body limit, what bounds the CPU time of one request
            (`WMARK_API_MAX_REQUEST_CHARS`).
        max_response_tokens: tokens with evidence (`return_tokens`) in one response, else 413: what
            bounds the size of a response (`WMARK_API_MAX_RESPONSE_TOKENS`).
        max_batch_items: most items in one batch request, else 413 (`WMARK_API_MAX_BATCH`).
        rate_per_second, rate_burst: token bucket per API token, else 429 (`WMARK_API_RATE`,
            `WMARK_API_BURST`); shared by every worker and process when `redis_url` is set, else
            per worker process.
        redis_url: Redis for the shared rate limits (`WMARK_REDIS_URL`; unset: per-process limits).
        redis_timeout: seconds a Redis call may take to connect, and as many to be answered,
            tried once (`WMARK_REDIS_TIMEOUT`).
        redis_breaker_failures, redis_breaker_reset: after this many failed Redis calls in a row,
            no request calls Redis for that many seconds (per-process limits meanwhile), then one
            request probes it (`WMARK_REDIS_BREAKER_FAILURES`, `WMARK_REDIS_BREAKER_RESET`).
        auth_fail_per_second, auth_fail_burst: token bucket of failed authentications per client
            address; past it, failures are answered 429 and no longer audited
            (`WMARK_API_AUTH_FAIL_RATE`, `WMARK_API_AUTH_FAIL_BURST`).
        ready_timeout: seconds /readyz waits for the database before answering 503
            (`WMARK_API_READY_TIMEOUT`).
        docs: serve the OpenAPI schema and /docs (`WMARK_API_DOCS`).
        serve_pid: the process id of the `wmark serve` that started this worker, which it
            exports as `WMARK_SERVE_PID` (`wmark.api.parent_watch`); None outside its workers.
        metrics_dir: Prometheus' multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`, which
            `wmark serve` sets for its workers and prometheus_client reads too); None: the
            metrics live in this process.
        receipt_issuer: who signs detection receipts, as they name the service
            (`WMARK_RECEIPT_ISSUER`, default "wmark@<host name>").
    """

    registry: RegistryConfig
    migrate: bool = False
    max_body_bytes: int = 1 << 20
    body_timeout: float = 10.0
    max_text_chars: int = 100_000
    max_request_chars: int = 200_000
    max_response_tokens: int = 20_000
    max_batch_items: int = 64
    rate_per_second: float = 20.0
    rate_burst: int = 40
    redis_url: str | None = None
    redis_timeout: float = 0.25
    redis_breaker_failures: int = 3
    redis_breaker_reset: float = 30.0
    auth_fail_per_second: float = 1.0
    auth_fail_burst: int = 20
    ready_timeout: float = 2.0
    docs: bool = True
    serve_pid: int | None = None
    metrics_dir: str | None = None
    receipt_issuer: str = "wmark"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the registry variables and the `WMARK_API_*` limits."""
        env = os.environ if env is None else env
        return cls(
            registry=RegistryConfig.from_env(env),
            migrate=_flag(env, "WMARK_API_MIGRATE", False),
            max_body_bytes=int(env_number(env, "WMARK_API_MAX_BODY_BYTES", 1 << 20, minimum=1024)),
            body_timeout=env_number(env, "WMARK_API_BODY_TIMEOUT", 10.0, minimum=0.1),
            max_text_chars=int(env_number(env, "WMARK_API_MAX_TEXT_CHARS", 100_000, minimum=1)),
            max_request_chars=int(env_number(env, "WMARK_API_MAX_REQUEST_CHARS", 200_000, minimum=1)),
            max_response_tokens=int(env_number(env, "WMARK_API_MAX_RESPONSE_TOKENS", 20_000, minimum=1)),
            max_batch_items=int(env_number(env, "WMARK_API_MAX_BATCH", 64, minimum=1)),
            rate_per_second=env_number(env, "WMARK_API_RATE", 20.0, minimum=0.001),
            rate_burst=int(env_number(env, "WMARK_API_BURST", 40, minimum=1)),
            redis_url=env.get("WMARK_REDIS_URL") or None,
            redis_timeout=env_number(env, "WMARK_REDIS_TIMEOUT", 0.25, minimum=0.001),
            redis_breaker_failures=int(env_number(env, "WMARK_REDIS_BREAKER_FAILURES", 3, minimum=1)),
            redis_breaker_reset=env_number(env, "WMARK_REDIS_BREAKER_RESET", 30.0, minimum=0.1),
            auth_fail_per_second=env_number(env, "WMARK_API_AUTH_FAIL_RATE", 1.0, minimum=0.001),
            auth_fail_burst=int(env_number(env, "WMARK_API_AUTH_FAIL_BURST", 20, minimum=1)),
            ready_timeout=env_number(env, "WMARK_API_READY_TIMEOUT", 2.0, minimum=0.01),
            docs=_flag(env, "WMARK_API_DOCS", True),
            serve_pid=int(pid) if (pid := env.get(SERVE_PID_ENV, "")).isdigit() else None,
            metrics_dir=env.get("PROMETHEUS_MULTIPROC_DIR") or None,
            receipt_issuer=default_issuer(env),
        )
