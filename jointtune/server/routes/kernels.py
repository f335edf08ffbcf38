"""`/v1/kernels`: the kernel versions the store has seen."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jointtune.server.auth import ReadAuthDep
from jointtune.server.deps import StoreDep
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import KernelOut, responses

router = APIRouter(prefix="/v1/kernels", tags=["kernels"], route_class=ServiceRoute)


@router.get("", response_model=list[KernelOut], responses=responses(401, 503))
def list_kernels(store: StoreDep, _role: ReadAuthDep) -> list[dict[str, Any]]:
    """Every (kernel, version) with records, oldest version first per kernel."""
    return [{"name": k.name, "version": k.version, "created_at": k.created_at} for k in store.list_kernels()]
