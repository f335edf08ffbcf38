"""`/v1/records/{record_id}`: one stored record by id, and its deletion (admin only).

A path of its own: `/v1/configs/{kernel}` is the lookup, and an id under the same template would
make two operations of one URL (an OpenAPI document may not hold both).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Response

from jointtune.db import Record
from jointtune.db.schema import RecordId
from jointtune.server.auth import AdminDep, ReadAuthDep
from jointtune.server.deps import StoreDep
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import responses

router = APIRouter(prefix="/v1/records", tags=["records"], route_class=ServiceRoute)

RecordIdPath = Annotated[RecordId, Path(description="a record's id (1 .. 2**31 - 1)")]


@router.get("/{record_id}", response_model=Record, responses=responses(401, 404, 422, 503))
def get_record(store: StoreDep, _role: ReadAuthDep, record_id: RecordIdPath) -> Any:
    """One stored record, as `GET /v1/configs` lists it."""
    record = store.get_record(record_id)
    if record is None:
        raise HTTPException(404, f"record_id: no record with id {record_id}")
    return record


@router.delete("/{record_id}", status_code=204, response_class=Response, responses=responses(401, 403, 404, 422, 503))
def delete_record(store: StoreDep, _role: AdminDep, record_id: RecordIdPath) -> Response:
    """Delete one record (admin only)."""
    if not store.delete_record(record_id):
        raise HTTPException(404, f"record_id: no record with id {record_id}")
    return Response(status_code=204)
