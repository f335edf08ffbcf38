"""One router per resource; `ROUTERS` is the order the app mounts them in."""

from __future__ import annotations

from jointtune.server.routes import bundles, configs, dashboard, hardware, health, kernels, records

ROUTERS = (
    configs.router,
    records.router,
    kernels.router,
    hardware.router,
    bundles.router,
    health.router,
    dashboard.router,
)

__all__ = ["ROUTERS"]
