"""`/v1/kernels`: the kernel versions the store has seen."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jointtune.server.auth import ReadAuthDep
from jointtune.server.deps import StoreDep
from jointtune.server.schemas import KernelOut

router = APIRouter(prefix="/v1/kernels", tags=["kernels"])


@router.get("", response_model=list[KernelOut])
def list_kernels(store: StoreDep, _role: ReadAuthDep) -> list[dict[str, Any]]:
    """Every (kernel, version) with records, oldest version first per kernel."""
    return [{"name": k.name, "version": k.version, "created_at": k.created_at} for k in store.list_kernels()]
