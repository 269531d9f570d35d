"""`wmark serve` (the detection service under uvicorn) and `wmark migrate` (bring the schema up to date)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Annotated

import typer

from wmark.cli.common import console
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.db import head_revision


def migrate() -> None:
    """Migrate the registry database to this release's schema (safe to run from several places at once)."""
    KeyRegistry.open(RegistryConfig.from_env(), migrate=True).close()
    console.print(f"schema at {head_revision()}", highlight=False)


def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 1,
    run_migrations: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="Migrate the database once before starting.")
    ] = True,
    log_level: Annotated[
        str, typer.Option(help="uvicorn log level: critical, error, warning, info, debug.")
    ] = "info",
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log each request.")
    ] = True,
) -> None:
    """Run the detection service (REST API, web page at /, metrics at /metrics).

    \b
    Examples:
      wmark serve
      WMARK_DATABASE_URL=postgresql+psycopg://wmark@db/wmark wmark serve --host 0.0.0.0 --workers 4
    """
    import uvicorn

    if run_migrations:
        migrate()
    metrics_dir = None
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker writes its samples here and /metrics sums them (prometheus_client multiprocess mode).
        metrics_dir = tempfile.mkdtemp(prefix="wmark-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        uvicorn.run(
            "wmark.api:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=access_log,
            server_header=False,
            timeout_graceful_shutdown=30,
        )
    finally:
        if metrics_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
