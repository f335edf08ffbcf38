"""`/v1/configs`: look up the config for a shape (exact or nearest), publish, list and delete records."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response

from jointtune.db import NewRecord
from jointtune.server.auth import AdminDep, AuthDep, ReadAuthDep
from jointtune.server.deps import StoreDep
from jointtune.server.routes._lookup import explain_miss, lookup_json, parse_dims
from jointtune.server.schemas import TEXT, LookupOut, PublishOut, RecordIn, RecordPage

router = APIRouter(prefix="/v1/configs", tags=["configs"])

_KNOWN = {"dtype", "world_size", "hardware_id", "kernel_version", "nearest"}
Text = Annotated[str, Query(min_length=1, max_length=128, pattern=TEXT)]


@router.get("/{kernel}", response_model=LookupOut)
def lookup(
    request: Request,
    store: StoreDep,
    _role: ReadAuthDep,
    kernel: Annotated[str, Path(min_length=1, max_length=128, pattern=TEXT)],
    dtype: Text,
    world_size: Annotated[int, Query(ge=1, le=1_000_000)],
    hardware_id: Text,
    kernel_version: Annotated[str | None, Query(min_length=1, max_length=64, pattern=TEXT)] = None,
    nearest: bool = True,
) -> dict[str, Any]:
    """The stored config for a shape; dims are extra query parameters named after the kernel's dims
    (e.g. `?M=8192&N=4096&K=12288`). Falls back to the nearest stored shape unless `nearest=false`."""
    shape = parse_dims(request.query_params.multi_items(), _KNOWN)
    lookups = request.app.state.metrics.lookups
    nearest_first = store.nearest(
        kernel=kernel,
        kernel_version=kernel_version,
        shape=shape,
        dtype=dtype,
        world_size=world_size,
        hardware_id=hardware_id,
        limit=1,
    )
    found = nearest_first[0] if nearest_first else None
    if found and (nearest or found[1] == 0):
        record, distance = found
        lookups.labels(result="exact" if distance == 0 else "nearest").inc()
        return lookup_json(record, distance)
    if not store.list_kernels(name=kernel):  # only on a miss: a hit proves the kernel exists
        lookups.labels(result="miss").inc()
        known = sorted({k.name for k in store.list_kernels()})
        raise HTTPException(404, f"kernel {kernel[:128]!r} is unknown; the store has records for {known}")
    lookups.labels(result="miss").inc()
    query = {"kernel_version": kernel_version, "dtype": dtype, "world_size": world_size, "hardware_id": hardware_id}
    message = explain_miss(store, kernel=kernel, shape=shape, query=query)
    if found:
        message += " (nearest=false: only exact shapes are returned)"
    raise HTTPException(404, message)


@router.post("", response_model=PublishOut)
def publish(store: StoreDep, _role: AuthDep, body: RecordIn) -> dict[str, Any]:
    """Publish a record; the store keeps it only if it beats the stored one. Publishing twice is harmless."""
    record, changed = store.upsert_record(NewRecord(**body.model_dump()))
    return {"record": record.to_json(), "changed": changed}


@router.get("", response_model=RecordPage)
def list_configs(
    store: StoreDep,
    _role: ReadAuthDep,
    kernel: Annotated[str | None, Query(min_length=1, max_length=128, pattern=TEXT)] = None,
    kernel_version: Annotated[str | None, Query(min_length=1, max_length=64, pattern=TEXT)] = None,
    hardware_id: Annotated[str | None, Query(min_length=1, max_length=128, pattern=TEXT)] = None,
    dtype: Annotated[str | None, Query(min_length=1, max_length=32, pattern=TEXT)] = None,
    world_size: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> dict[str, Any]:
    """Stored records matching every given filter, a page at a time, with the total count."""
    filters = {
        "kernel": kernel,
        "kernel_version": kernel_version,
        "hardware_id": hardware_id,
        "dtype": dtype,
        "world_size": world_size,
    }
    items = store.list_records(**filters, limit=limit, offset=offset)
    total = store.count_records(**filters)
    return {"total": total, "limit": limit, "offset": offset, "items": [r.to_json() for r in items]}


@router.delete("/{record_id}", status_code=204, response_class=Response)
def delete_config(store: StoreDep, _role: AdminDep, record_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> Response:
    """Delete one record (admin only)."""
    if not store.delete_record(record_id):
        raise HTTPException(404, f"record_id: no record with id {record_id}")
    return Response(status_code=204)
