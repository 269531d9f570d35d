"""The app factory: `create_app(settings)` wires settings, registry, routes, limits and metrics.

Nothing is built at import time. The registry (engine, master key) is opened in the lifespan,
once per worker process; `uvicorn --factory wmark.api:create_app` or `wmark serve` run it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from wmark import __version__
from wmark.api import (
    access_log,
    audit_routes,
    detect_routes,
    health_routes,
    key_routes,
    page,
    receipt_routes,
)
from wmark.api.calibration_states import CalibrationStates
from wmark.api.deps import Service, refusal_before_error
from wmark.api.detectors import DetectorCache
from wmark.api.errors import install_error_handlers
from wmark.api.fast_detect import FastDetectRoute
from wmark.api.generate_settings import GenerationSettings
from wmark.api.limits import BodyLimitMiddleware
from wmark.api.metrics import Metrics, MetricsMiddleware
from wmark.api.parent_watch import watch_parent
from wmark.api.settings import Settings
from wmark.api.shared_limits import RedisOptions, rate_limiters
from wmark.api.token_cache import TokenCache
from wmark.errors import WmarkError
from wmark.keys import KeyRegistry

__all__ = ["create_app"]

log = logging.getLogger("wmark.api")
_THREADS = 40  # requests in progress per process, as anyio's default thread limiter

_DESCRIPTION = """\
Detects wmark watermarks with exact p-values, and keeps a hash-chained audit log of every answer.

Authenticate with `Authorization: Bearer <token>` (tokens from `wmark tokens create --role ROLE`).
Roles: `detector` (POST /v1/detect*), `auditor` (GET /v1/audit*, /metrics), `generator`
(/v1/chat/completions, /v1/completions, /v1/models, when the service generates: `wmark serve
--generate`), `admin` (/v1/keys*, and everything the other roles may do). Errors are JSON
`{"code", "message"}`, except on the OpenAI-compatible routes: `{"error": {"message", "type", "code"}}`.
"""


def create_app(settings: Settings | None = None, generation: GenerationSettings | None = None) -> FastAPI:
    """Build the service.

    Args:
        settings: the settings; default `Settings.from_env()`.
        generation: serve watermarked generation with these settings; default
            `GenerationSettings.from_env()` (None, so off, unless WMARK_GENERATE_TARGET is set).
    """
    settings = settings if settings is not None else Settings.from_env()
    generation = generation if generation is not None else GenerationSettings.from_env()
    metrics = Metrics(settings.metrics_dir)
    access_log.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        orphan_watch = watch_parent(settings.serve_pid)
        executor = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="wmark-api")
        registry = await run_in_threadpool(KeyRegistry.open, settings.registry, migrate=settings.migrate)
        detectors = DetectorCache(registry, on_build=metrics.detector_builds.inc)
        try:
            await run_in_threadpool(detectors.warm)
        except (WmarkError, SQLAlchemyError) as exc:
            # e.g. the database is not reachable or not migrated yet: /readyz reports it
            log.warning("detector not built at start-up: %s", type(exc).__name__)
        limiters = rate_limiters(
            _redis_options(settings),
            {
                "token": (settings.rate_per_second, settings.rate_burst),
                "auth_fail": (settings.auth_fail_per_second, settings.auth_fail_burst),
            },
            on_open=metrics.redis_breaker_opens.inc,
        )
        app.state.service = Service(
            settings=settings,
            registry=registry,
            detectors=detectors,
            limiter=limiters["token"],
            auth_limiter=limiters["auth_fail"],
            metrics=metrics,
            token_cache=TokenCache(registry.tokens),
            executor=executor,
            calibration_states=CalibrationStates(registry.calibrations),
        )
        generator = None
        if generation is not None:  # torch loads only here
            from wmark.api.generation import Generation

            generator = await run_in_threadpool(Generation.start, generation, registry, metrics)
            app.state.generation = generator
        try:
            yield
        finally:
            if generator is not None:
                await run_in_threadpool(generator.close)
            executor.shutdown(wait=True)
            registry.close()
            if orphan_watch is not None:
                orphan_watch.set()

    app = FastAPI(
        title="wmark detection service",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs" if settings.docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    install_error_handlers(app, gate=refusal_before_error)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, read_timeout=settings.body_timeout
    )
    if generation is not None:
        from wmark.api import generate_routes
        from wmark.api.openai_errors import OpenAIErrorMiddleware

        app.include_router(generate_routes.router)
        app.add_middleware(OpenAIErrorMiddleware, paths=generate_routes.OPENAI_PATHS)  # reshapes 413s too
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees 413s too
    app.router.routes.insert(0, FastDetectRoute(app))  # first: ahead of the FastAPI route of POST /v1/detect
    for module in (detect_routes, key_routes, audit_routes, receipt_routes, health_routes, page):
        app.include_router(module.router)
    app.include_router(key_routes.vllm_router)
    return app


def _redis_options(settings: Settings) -> RedisOptions | None:
    if settings.redis_url is None:
        return None
    return RedisOptions(
        url=settings.redis_url,
        timeout=settings.redis_timeout,
        failures=settings.redis_breaker_failures,
        reset_after=settings.redis_breaker_reset,
    )
