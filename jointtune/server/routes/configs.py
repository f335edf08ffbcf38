"""`/v1/configs`: look up the config for a shape (exact or nearest), publish and list records."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from jointtune.db import LookupOut, NewRecord, RecordIn, RecordKey
from jointtune.db.schema import (
    MAX_INT32,
    RESERVED_DIM_NAMES,
    SHAPE_SCHEMA,
    Dtype,
    Name64,
    Name128,
    Timing,
    WorldSize,
)
from jointtune.server.auth import AuthDep, ReadAuthDep
from jointtune.server.deps import StoreDep, declared_query_only
from jointtune.server.routes._lookup import explain_miss, keyed_shape, parse_dims, registered_space
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import PublishOut, RecordPage, responses

router = APIRouter(prefix="/v1/configs", tags=["configs"], route_class=ServiceRoute)

#: the shape's dims travel as query parameters of their own names: an object parameter, form-exploded
_DIMS = {
    "name": "dims",
    "in": "query",
    "required": True,
    "style": "form",
    "explode": True,
    "schema": SHAPE_SCHEMA,
    "description": "The shape: one query parameter per dim, named after the kernel's dims "
    "(`M=8192&N=4096&K=12288`); names are identifiers other than the parameters above.",
}


@router.get("/{kernel}", response_model=LookupOut, responses=responses(401, 404, 422, 503),
            openapi_extra={"parameters": [_DIMS]})  # fmt: skip
def lookup(
    request: Request,
    store: StoreDep,
    _role: ReadAuthDep,
    kernel: Annotated[Name128, Path()],
    dtype: Annotated[Dtype, Query(description="a torch dtype name or an alias (bf16, fp16, half, fp32, float)")],
    world_size: Annotated[WorldSize, Query()],
    hardware_id: Annotated[Name128, Query()],
    kernel_version: Annotated[Name64 | None, Query()] = None,
    nearest: bool = True,
    timing: Annotated[
        Timing,
        Query(
            description="the timing policy the record was measured under: gpu (GPU time; what every record made "
            "before policies existed is), eager (calls back to back, host included) or graph (CUDA-graph "
            "replay). Only records of this policy answer; the default keeps older clients' answers."
        ),
    ] = "gpu",
) -> Any:
    """The stored config for a shape; dims are extra query parameters named after the kernel's dims
    (e.g. `?M=8192&N=4096&K=12288`). A dim the family buckets is bucketed first, as its decorator's key does
    (flash_decode's S: any cache length finds its bucket's record exactly). Falls back to the nearest stored shape
    of the same timing policy unless `nearest=false`; 404 when nothing comparable is stored, saying what the store
    has for this kernel."""
    space = registered_space(kernel)
    dims = parse_dims(request.query_params.multi_items(), set(RESERVED_DIM_NAMES), space.dims if space else None)
    shape = keyed_shape(space, dims, dtype, world_size)
    lookups = request.app.state.metrics.lookups
    key = RecordKey(kernel=kernel, kernel_version=kernel_version, shape=shape, dtype=dtype, world_size=world_size,
                    hardware_id=hardware_id, timing=timing)  # fmt: skip
    if nearest or kernel_version is None:
        nearest_first = store.nearest(key, limit=1)
        found = nearest_first[0] if nearest_first else None
    else:  # only the exact shape will do: one probe of the unique key, not a ranking of the shapes
        exact = store.best(key)
        found = None if exact is None else (exact, 0.0)
    if found and (nearest or found[1] == 0):
        record, distance = found
        lookups.labels(result="exact" if distance == 0 else "nearest").inc()
        return LookupOut.of(record, distance)
    lookups.labels(result="miss").inc()
    message = explain_miss(store, key)
    if not nearest and "closest stored shapes" in message:
        message += " (nearest=false: only exact shapes are returned)"
    raise HTTPException(404, message)


@router.post("", response_model=PublishOut, responses=responses(401, 403, 413, 422, 503))
def publish(store: StoreDep, _role: AuthDep, body: RecordIn) -> dict[str, Any]:
    """Publish a record; the store keeps it only if it beats the stored one. Publishing twice is harmless."""
    record, changed = store.upsert_record(NewRecord.of(body))
    return {"record": record.to_json(), "changed": changed}


@router.get(
    "", response_model=RecordPage, responses=responses(401, 422, 429, 503), dependencies=[Depends(declared_query_only)]
)
async def list_configs(
    request: Request,
    store: StoreDep,
    _role: ReadAuthDep,
    kernel: Annotated[Name128 | None, Query()] = None,
    kernel_version: Annotated[Name64 | None, Query()] = None,
    hardware_id: Annotated[Name128 | None, Query()] = None,
    dtype: Annotated[Dtype | None, Query()] = None,
    world_size: Annotated[WorldSize | None, Query()] = None,
    timing: Annotated[Timing | None, Query(description="only records of this timing policy")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
) -> Response:
    """Stored records matching every given filter, a page at a time, with the total count. A read that grows with
    the offset: a worker answers JOINTTUNE_LIST_CONCURRENCY listings at once (the dashboard's pages among them) and
    429 beyond them."""
    where = RecordKey.any(kernel=kernel, kernel_version=kernel_version, hardware_id=hardware_id, dtype=dtype,
                          world_size=world_size, timing=timing)  # fmt: skip

    def read() -> Response:  # serialised here too: a page of 1000 records would hold the event loop
        items = store.list_records(where, limit=limit, offset=offset)
        total = store.count_records(where)
        page = {"total": total, "limit": limit, "offset": offset, "items": [r.to_json() for r in items]}
        return Response(RecordPage.model_validate(page).model_dump_json(), media_type="application/json")

    async with request.app.state.list_gate.enter_async():  # on the event loop: a refusal costs no thread hop
        return await run_in_threadpool(read)
