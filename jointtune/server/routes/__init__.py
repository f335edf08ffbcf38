"""One router per resource; `ROUTERS` is the order the app mounts them in."""

from __future__ import annotations

from jointtune.server.routes import bundles, configs, hardware, health, kernels

ROUTERS = (configs.router, kernels.router, hardware.router, bundles.router, health.router)

__all__ = ["ROUTERS"]
