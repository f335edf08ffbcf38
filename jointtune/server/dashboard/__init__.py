"""The dashboard: tuned configs per kernel and hardware, a speedup heatmap, and tuning curves.

Server-rendered HTML with inline SVG, so it works offline and in any browser without assets.

Example:
    >>> html = render_page(collect(store), backend=store.backend)   # doctest: +SKIP
"""

from __future__ import annotations

from jointtune.server.dashboard.data import DashboardData, StudyCurve, collect
from jointtune.server.dashboard.page import render_page

__all__ = ["DashboardData", "StudyCurve", "collect", "render_page"]
