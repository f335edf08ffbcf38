"""`/v1/bundles`: export one hardware's records as a single JSON document, and import one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from jointtune.server.auth import AuthDep, ReadAuthDep
from jointtune.server.bundle import export_bundle, import_bundle
from jointtune.server.deps import StoreDep
from jointtune.server.schemas import TEXT, BundleIn, ImportOut

router = APIRouter(prefix="/v1/bundles", tags=["bundles"])


@router.get("/{hardware_id}")
def export(
    store: StoreDep,
    _role: ReadAuthDep,
    hardware_id: Annotated[str, Path(min_length=1, max_length=128, pattern=TEXT)],
    kernel: Annotated[str | None, Query(min_length=1, max_length=128, pattern=TEXT)] = None,
) -> dict[str, Any]:
    """The hardware profile and all its records (optionally of one kernel), ready for `POST /v1/bundles`."""
    bundle = export_bundle(store, hardware_id, kernel)
    if bundle is None:
        known = [h.hardware_id for h in store.list_hardware()]
        raise HTTPException(404, f"hardware_id: {hardware_id[:128]!r} is unknown; the store has {known[:50]}")
    return bundle


@router.post("", response_model=ImportOut)
def import_(store: StoreDep, _role: AuthDep, body: BundleIn) -> dict[str, Any]:
    """Import a bundle: validated as a whole first, then each record kept only if it beats the stored one."""
    return import_bundle(store, body.model_dump(mode="json"))
