"""`wmark serve` (the detection service under uvicorn, optionally generating too) and `wmark migrate`.

Generation is a switch of the same service rather than a command of its own: generated text is
audited in the same log, detected by the same keys, and served behind the same tokens, rate
limits and metrics, so one process does both.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from wmark.cli.common import console
from wmark.generator.names import AUTO, DRAFTER_HELP, METHOD_NAMES, PRECISION_HELP
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.db import head_revision


def migrate() -> None:
    """Migrate the registry database to this release's schema (safe to run from several places at once)."""
    KeyRegistry.open(RegistryConfig.from_env(), migrate=True).close()
    console.print(f"schema at {head_revision()}", highlight=False)


_METRICS_PREFIX = "wmark-metrics-"
# read by wmark.api.settings in each worker (named, not imported: cli and api are separate layers)
_PARENT_ENV = "WMARK_SERVE_PID"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _sweep_metrics_dirs() -> None:
    """Remove the metrics directories of servers that were killed before they could (kill -9)."""
    pattern = re.compile(rf"^{_METRICS_PREFIX}(\d+)-")
    for path in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*"):
        match = pattern.match(path.name)
        if match and path.stat().st_uid == os.getuid() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


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
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            envvar=["WMARK_FORWARDED_ALLOW_IPS", "FORWARDED_ALLOW_IPS"],
            help="Proxies (comma-separated addresses or networks, '*' for any) whose X-Forwarded-For"
            " and X-Forwarded-Proto are trusted; default none: the client is the TCP peer.",
        ),
    ] = None,
    generate: Annotated[
        bool,
        typer.Option(
            "--generate",
            help="Also serve watermarked generation (OpenAI-compatible chat and completions).",
        ),
    ] = False,
    target: Annotated[
        str, typer.Option(help="--generate: 'embedded', a local model dir, or a cached HF model id.")
    ] = "embedded",
    drafter: Annotated[str, typer.Option(help=f"--generate: the drafter: {DRAFTER_HELP}")] = AUTO,
    method: Annotated[str, typer.Option(help=f"--generate: sampler ({', '.join(METHOD_NAMES)}).")] = "mpfr",
    key: Annotated[
        str | None, typer.Option(help="--generate: watermark key id (default: the only active key).")
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="--generate: the `model` clients send (default: the target's name).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="--generate: most tokens per request.")] = 512,
    max_prompt_tokens: Annotated[
        int, typer.Option(min=1, help="--generate: longest prompt, in tokens after the chat template.")
    ] = 4096,
    queue: Annotated[
        int,
        typer.Option(
            min=0, help="--generate: requests that may wait while one generates (more get 429; 0: none wait)."
        ),
    ] = 8,
    queue_per_token: Annotated[
        int | None,
        typer.Option(min=1, help="--generate: places one token may hold, running or waiting (default half)."),
    ] = None,
    min_temperature: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=2.0,
            help="--generate: the lowest temperature a request may ask for (default 0.7): lower, the "
            "text keeps too little randomness to carry the watermark.",
        ),
    ] = None,
    min_top_p: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="--generate: the lowest top_p a request may take (default 0.9)."),
    ] = None,
    device: Annotated[str, typer.Option(help="--generate: cpu or cuda.")] = "cpu",
    precision: Annotated[
        str,
        typer.Option(help=f"--generate: {PRECISION_HELP}"),
    ] = "auto",
) -> None:
    """Run the detection service (REST API, web page at /, metrics at /metrics); with --generate,
    also watermarked generation for `generator` tokens, from one loaded model pair.

    \b
    Examples:
      wmark serve
      WMARK_DATABASE_URL=postgresql+psycopg://wmark@db/wmark wmark serve --host 0.0.0.0 --workers 4
      wmark serve --forwarded-allow-ips 10.0.0.5      # behind a reverse proxy at 10.0.0.5
      wmark serve --generate --method mpfr --key wk_0123456789ab
    """
    import uvicorn

    if generate:
        if workers != 1:
            raise typer.BadParameter(
                "--generate serves one model pair: use --workers 1", param_hint="--workers"
            )
        # the worker's create_app reads them (wmark.api.generate_settings)
        variables = {
            "TARGET": target,
            "DRAFTER": drafter,
            "METHOD": method,
            "KEY": key,
            "MODEL_NAME": model_name,
            "DEVICE": device,
            "PRECISION": precision,
            "MAX_TOKENS": max_tokens,
            "MAX_PROMPT_TOKENS": max_prompt_tokens,
            "QUEUE": queue,
            "QUEUE_PER_TOKEN": queue_per_token,
            "MIN_TEMPERATURE": min_temperature,
            "MIN_TOP_P": min_top_p,
        }
        os.environ.update({f"WMARK_GENERATE_{k}": str(v) for k, v in variables.items() if v is not None})
    if run_migrations:
        migrate()
    metrics_dir = None
    if workers > 1:
        os.environ[_PARENT_ENV] = str(os.getpid())  # workers exit if this process is killed
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Each worker writes its samples here and /metrics sums them (prometheus_client
            # multiprocess mode); the name carries this process id so a later start can remove it.
            _sweep_metrics_dirs()
            metrics_dir = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")
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
            # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: any local client could
            # then choose the address its failed authentications are limited and audited under
            proxy_headers=bool(forwarded_allow_ips),
            forwarded_allow_ips=forwarded_allow_ips or None,
            server_header=False,
            timeout_graceful_shutdown=30,
            http="wmark.api.protocol:JsonErrorHttpToolsProtocol",  # protocol-level 400s in the JSON shape
            loop="uvloop",
        )
    finally:
        if metrics_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop(_PARENT_ENV, None)
