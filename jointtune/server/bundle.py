"""The bundle format shared by the service and the offline CLI: one JSON document per hardware.

`{"schema_version": 1, "hardware": {...}, "records": [...]}`. Import validates the whole document
first (every record, every hardware_id) and writes nothing when any part is bad; then it upserts
each record, keeping the better one per key, so importing twice changes nothing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from jointtune import __version__
from jointtune.db import InvalidRecordError, NewRecord, Store
from jointtune.server.schemas import BundleIn

SCHEMA_VERSION = 1
_PAGE = 1000
_RECORD_ONLY = ("id", "shape_key", "config_hash", "speedup", "created_at", "updated_at")


class BundleError(InvalidRecordError):
    """A bundle that can't be imported; the message names the bad part and what is allowed."""


def export_bundle(store: Store, hardware_id: str, kernel: str | None = None) -> dict[str, Any] | None:
    """The bundle for one hardware (optionally one kernel), or None when the store knows nothing of it."""
    profile = store.get_hardware(hardware_id)
    records: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = store.list_records(hardware_id=hardware_id, kernel=kernel, limit=_PAGE, offset=offset)
        for record in page:
            data = record.to_json()
            for name in _RECORD_ONLY:
                data.pop(name)
            records.append(data)
        if len(page) < _PAGE:
            break
        offset += _PAGE
    if profile is None and not records:
        return None
    hardware = {"hardware_id": hardware_id, "name": hardware_id, "fingerprint": {}}
    if profile is not None:
        hardware = {"hardware_id": profile.hardware_id, "name": profile.name, "fingerprint": profile.fingerprint}
    return {
        "schema_version": SCHEMA_VERSION,
        "tuner_version": __version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "hardware": hardware,
        "records": records,
    }


def parse_bundle(data: Any) -> tuple[dict[str, Any], list[NewRecord]]:
    """Check a whole bundle; return (hardware, records) or raise BundleError naming every problem."""
    if not isinstance(data, dict):
        raise BundleError(f"bundle: {type(data).__name__} is not allowed; it must be a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(f"schema_version: {version!r} is not allowed; this version reads {SCHEMA_VERSION}")
    try:
        bundle = BundleIn.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(err) for err in exc.errors()[:10]]
        raise BundleError("bundle: " + "; ".join(problems)) from None
    hardware = bundle.hardware.model_dump()
    records: list[NewRecord] = []
    problems: list[str] = []
    for index, item in enumerate(bundle.records):
        if item.hardware_id != bundle.hardware.hardware_id:
            problems.append(
                f"records[{index}].hardware_id: {item.hardware_id!r} is not allowed; "
                f"it must be the bundle's {bundle.hardware.hardware_id!r}"
            )
            continue
        try:
            records.append(NewRecord(**item.model_dump()).validate())
        except InvalidRecordError as exc:
            problems.append(f"records[{index}]: {exc}")
    if problems:
        raise BundleError("bundle: " + "; ".join(problems[:10]))
    return hardware, records


def _problem(err: Any) -> str:
    got = "" if err["type"] == "missing" else f" (got {err['input']!r:.80})"
    return f"{_loc(err['loc'])}: {err['msg']}{got}"


def _loc(parts: tuple[Any, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def import_bundle(store: Store, data: Any) -> dict[str, Any]:
    """Validate, then write the hardware profile and every record; returns the counts."""
    hardware, records = parse_bundle(data)
    existing = store.get_hardware(hardware["hardware_id"])
    if existing is None or hardware["fingerprint"]:  # never blank a known fingerprint with a placeholder
        store.upsert_hardware(**hardware)
    changed = sum(1 for record in records if store.upsert_record(record)[1])
    return {
        "hardware_id": hardware["hardware_id"],
        "records": len(records),
        "changed": changed,
        "unchanged": len(records) - changed,
    }
