"""`/dashboard`: the HTML overview of the store and the Optuna studies beside it (read access)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from jointtune.server.auth import ReadAuthDep
from jointtune.server.dashboard import collect, render_page
from jointtune.server.deps import StoreDep
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import responses

router = APIRouter(tags=["dashboard"], route_class=ServiceRoute)


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **responses(401, 503)},
)
def dashboard(store: StoreDep, _role: ReadAuthDep) -> HTMLResponse:
    """Tuned configs per kernel and hardware, the speedup heatmap over shapes, and tuning curves."""
    html = render_page(collect(store), backend=store.backend)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})
