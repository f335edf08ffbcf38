"""`/dashboard`: the HTML overview of the store and the Optuna studies beside it (read access)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from jointtune.server.auth import ReadAuthDep
from jointtune.server.dashboard import collect, render_page
from jointtune.server.deps import StoreDep

router = APIRouter(tags=["dashboard"])


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard(store: StoreDep, _role: ReadAuthDep) -> HTMLResponse:
    """Tuned configs per kernel and hardware, the speedup heatmap over shapes, and tuning curves."""
    html = render_page(collect(store), backend=store.backend)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})
