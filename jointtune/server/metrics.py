"""Prometheus metrics, one registry per app (so tests can build many apps in one process).

`jointtune_request_seconds{method,route,status}`: request latency by route template (never the raw
path, which would make one series per shape). Every label has a bounded set of values, whatever
clients send: methods outside HTTP's own (`METHODS`) count as "other", paths no route matches as
"unmatched", and statuses are the few the service answers. `jointtune_lookups_total{result}`:
exact, nearest or miss.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

#: the methods labelled by name; any other method a client invents is labelled "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The service's collectors, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Histogram(
            "jointtune_request_seconds",
            "Request latency by route template",
            ["method", "route", "status"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.lookups = Counter("jointtune_lookups", "Config lookups by result", ["result"], registry=self.registry)
        for result in ("exact", "nearest", "miss"):
            self.lookups.labels(result=result)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Times every HTTP request and labels it with the route that matched (or 'unmatched')."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.requests.labels(method, template, str(status["code"])).observe(time.perf_counter() - start)
