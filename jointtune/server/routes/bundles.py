"""`/v1/bundles`: export one hardware's records a page at a time, and import a bundle (all or nothing)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from jointtune.db.schema import MAX_INT32, Name128
from jointtune.server.auth import AuthDep, ReadAuthDep
from jointtune.server.bundle import MAX_PAGE_RECORDS, export_page, import_bundle
from jointtune.server.deps import StoreDep, declared_query_only
from jointtune.server.limits import listed
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import BundleIn, BundleOut, ImportOut, responses

router = APIRouter(prefix="/v1/bundles", tags=["bundles"], route_class=ServiceRoute)


@router.get(
    "/{hardware_id}",
    response_model=BundleOut,
    responses=responses(401, 404, 422, 429, 503),
    dependencies=[Depends(declared_query_only)],
)
async def export(
    request: Request,
    store: StoreDep,
    _role: ReadAuthDep,
    hardware_id: Annotated[Name128, Path()],
    kernel: Annotated[Name128 | None, Query()] = None,
    after: Annotated[int, Query(ge=0, le=MAX_INT32, description="the `next_after` of the previous page")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_RECORDS, description="records per page, at most")] = 500,
) -> Response:
    """One page of the hardware profile and its records (optionally of one kernel), ready for
    `POST /v1/bundles` as it is. Pages hold at most `limit` records and JOINTTUNE_EXPORT_PAGE_BYTES
    of them; fetch the next with `after=next_after` until `next_after` is null."""
    max_bytes = request.app.state.settings.export_page_bytes

    def build() -> bytes | None:
        return export_page(store, hardware_id, kernel=kernel, after=after, limit=limit, max_bytes=max_bytes)

    async with request.app.state.export_gate.enter_async():  # on the event loop: a refusal holds no thread
        page = await run_in_threadpool(build)
    if page is None:
        known = listed(*await run_in_threadpool(store.hardware_ids))
        raise HTTPException(404, f"hardware_id: {hardware_id!r} is unknown; the store has {known}")
    return Response(page, media_type="application/json")


@router.post("", response_model=ImportOut, responses=responses(401, 403, 413, 422, 503))
def import_(store: StoreDep, _role: AuthDep, body: BundleIn) -> dict[str, Any]:
    """Import a bundle (an export page as served, or a `jointtune export` file within the body limit):
    validated as a whole, then written in one transaction, each record kept only if it beats the
    stored one for its key."""
    return import_bundle(store, body)
