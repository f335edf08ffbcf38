"""`/v1/hardware`: the hardware profiles records refer to."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jointtune.server.auth import ReadAuthDep
from jointtune.server.deps import StoreDep
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import HardwareOut, responses

router = APIRouter(prefix="/v1/hardware", tags=["hardware"], route_class=ServiceRoute)


@router.get("", response_model=list[HardwareOut], responses=responses(401, 503))
def list_hardware(store: StoreDep, _role: ReadAuthDep) -> list[dict[str, Any]]:
    """Every hardware profile (placeholders for hardware only seen in records have an empty fingerprint)."""
    return [
        {"hardware_id": h.hardware_id, "name": h.name, "fingerprint": h.fingerprint, "created_at": h.created_at}
        for h in store.list_hardware()
    ]
