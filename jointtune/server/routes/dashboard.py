"""`/dashboard`: the HTML overview of the store and the Optuna studies beside it (read access), a page at a time.

A page renders `PAGE_RECORDS` records (the first page also the tuning curves) and goes through the listings'
gate (`CostGate`): a worker renders JOINTTUNE_LIST_CONCURRENCY pages at once and answers 429 beyond them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from jointtune.db import Store
from jointtune.db.schema import MAX_INT32
from jointtune.server.auth import ReadAuthDep
from jointtune.server.dashboard import collect, render_page
from jointtune.server.dashboard.data import PAGE_RECORDS
from jointtune.server.deps import StoreDep, declared_query_only
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import responses

router = APIRouter(tags=["dashboard"], route_class=ServiceRoute)


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **responses(401, 404, 422, 429, 503)},
    dependencies=[Depends(declared_query_only)],
)
async def dashboard(
    request: Request,
    store: StoreDep,
    _role: ReadAuthDep,
    page: Annotated[int, Query(ge=1, le=MAX_INT32 // PAGE_RECORDS, description=f"{PAGE_RECORDS} configs a page")] = 1,
) -> HTMLResponse:
    """Tuned configs per kernel and hardware, the speedup heatmap over shapes, and (on the first page) the tuning
    curves; 404 past the last page."""
    async with request.app.state.list_gate.enter_async():  # on the event loop: a refusal costs no thread hop
        html = await run_in_threadpool(_render, store, page)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def _render(store: Store, page: int) -> str:
    data = collect(store, page=page)
    if page > data.pages:
        raise HTTPException(404, f"page: {page} is past the last page ({data.pages})")
    return render_page(data, backend=store.backend)
