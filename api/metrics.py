"""Prometheus metrics: requests by route and status, latency, detections by verdict, auth failures,
and (when the service generates) generated tokens, AATPS, and the generation queue's length.

With several worker processes (`wmark serve --workers N`), `wmark serve` points
PROMETHEUS_MULTIPROC_DIR at a fresh directory before the workers start; each worker then writes
its samples there and `/metrics` sums all workers. With one process, the app keeps its own registry.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wmark.api.route_match import matching_routes

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "MetricsMiddleware"]

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# tokens per target forward pass: 1.0 without speculation, up to L + 1 with it
_AATPS_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


class Metrics:
    """The service's metrics (one instance per app)."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir  # `Settings.metrics_dir`
        # In multiprocess mode samples go to files and are collected at scrape time, so the
        # metrics are not registered anywhere; otherwise in a registry of this app alone.
        self.registry = None if self.multiprocess_dir else CollectorRegistry()
        self.requests = Counter(
            "wmark_http_requests",
            "HTTP requests by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "wmark_http_request_duration_seconds",
            "Time from request to the end of the response, by route template",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.verdicts = Counter(
            "wmark_detections", "Detections by verdict", ["verdict"], registry=self.registry
        )
        self.auth_failures = Counter(
            "wmark_auth_failures", "Rejected requests by reason", ["reason"], registry=self.registry
        )
        self.detector_builds = Counter(
            "wmark_detector_builds", "Detectors built (after key changes)", registry=self.registry
        )
        self.redis_breaker_opens = Counter(
            "wmark_redis_breaker_opens",
            "Times Redis stopped answering and the rate limits fell back to per process",
            registry=self.registry,
        )
        self.generated_tokens = Counter(
            "wmark_generated_tokens", "Tokens generated (watermarked)", registry=self.registry
        )
        self.generations = Counter(
            "wmark_generations", "Generations by finish reason", ["finish_reason"], registry=self.registry
        )
        self.aatps = Histogram(
            "wmark_generation_aatps",
            "Average accepted tokens per target forward pass, per generation",
            buckets=_AATPS_BUCKETS,
            registry=self.registry,
        )
        self.queue_length = Gauge(
            "wmark_generation_queue_length",
            "Generation requests waiting for the model",
            multiprocess_mode="livesum",
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The exposition text (all workers summed in multiprocess mode)."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        assert self.registry is not None
        return generate_latest(self.registry)


def _route(scope: Scope) -> str:
    """The route template of the request: set by the router, or matched here for requests answered
    before routing (413, 408, a client gone mid-body)."""
    route = getattr(scope.get("route"), "path", None)
    if route is not None:
        return str(route)
    for template, methods in matching_routes(scope):
        if scope.get("method") in methods:
            return template
    return "unmatched"


class MetricsMiddleware:
    """Counts and times every HTTP request, labelled by the route template (not the raw path).

    A request whose client disconnected before any answer is counted with status 499 (nginx's
    "client closed request"), not as a server error.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None
        gone = False

        async def receive_wrapper() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-content-type-options", b"nosniff"))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            route = _route(scope)
            method = scope.get("method", "")
            label = str(status) if status is not None else ("499" if gone else "500")
            self.metrics.requests.labels(method, route, label).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
