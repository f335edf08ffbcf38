"""The bundle format shared by the service and the offline CLI: one JSON document per hardware.

`{"schema_version": 1, "hardware": {...}, "records": [...]}` (and, on a served page, `next_after`).
The service exports a hardware's records a page at a time (`export_page`): pages are cut by record
count and by size, so every page fits the service's request body limit and can be posted back as
it is; `next_after` is the cursor of the next page (records are paged by id, so a page is the same
however large the store is, and publishing meanwhile never shifts records between pages). The CLI
streams all pages into one file (`write_bundle`).

An import validates every bundle first and writes nothing when any part is bad; then it writes the
hardware profiles and all records in one transaction (all or nothing, see `Store.import_records`),
keeping the better record per key, so importing twice changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import IO, Any

from pydantic import ValidationError

from jointtune._version import __version__
from jointtune.db import InvalidRecordError, NewRecord, Store
from jointtune.db.schema import describe, problems_of
from jointtune.server.schemas import SCHEMA_VERSION, BundleIn

#: the most records one export page holds (its size is bounded separately)
MAX_PAGE_RECORDS = 1000
_CLI_PAGE = 1000


class BundleError(InvalidRecordError):
    """A bundle that can't be imported; the message names the bad part and what is allowed."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _envelope(store: Store, hardware_id: str) -> dict[str, Any] | None:
    profile = store.get_hardware(hardware_id)
    if profile is None:  # publishing creates a placeholder profile: no profile, no records
        return None
    return {
        "schema_version": SCHEMA_VERSION,
        "tuner_version": __version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "hardware": {"hardware_id": profile.hardware_id, "name": profile.name, "fingerprint": profile.fingerprint},
    }


def export_page(
    store: Store, hardware_id: str, *, kernel: str | None = None, after: int = 0, limit: int = 500, max_bytes: int
) -> bytes | None:
    """One page of a hardware's bundle as JSON bytes (records with id > `after`, at most `limit` of
    them and about `max_bytes` of records, never fewer than one), or None for an unknown hardware."""
    envelope = _envelope(store, hardware_id)
    if envelope is None:
        return None
    rows = store.export_json(hardware_id=hardware_id, kernel=kernel, after=after, limit=limit + 1)
    more, parts, size, last = len(rows) > limit, [], 0, after
    for record_id, text in rows[:limit]:
        length = len(text.encode())
        if parts and size + length + 1 > max_bytes:
            more = True
            break
        parts.append(text)
        size += length + 1
        last = record_id
    head = _dumps({**envelope, "next_after": last if more else None})
    return f'{head[:-1]},"records":[{",".join(parts)}]}}'.encode()


def write_bundle(store: Store, hardware_id: str, out: IO[str], *, kernel: str | None = None) -> int | None:
    """Stream a hardware's whole bundle to `out` page by page (memory stays one page); returns the
    number of records, or None (nothing written) for an unknown hardware."""
    envelope = _envelope(store, hardware_id)
    if envelope is None:
        return None
    out.write(_dumps(envelope)[:-1] + ',"records":[')
    after, count = 0, 0
    while True:
        page = store.export_json(hardware_id=hardware_id, kernel=kernel, after=after, limit=_CLI_PAGE)
        for _, text in page:
            out.write(("," if count else "") + "\n" + text)
            count += 1
        if len(page) < _CLI_PAGE:
            break
        after = page[-1][0]
    out.write("\n]}\n")
    return count


def parse_bundle(data: Any, *, source: str = "bundle") -> BundleIn:
    """Check a whole bundle (JSON text or bytes, or already-parsed JSON); raise BundleError naming
    every problem. JSON text is parsed strictly: no NaN or Infinity, no lone surrogates."""
    try:
        if isinstance(data, (str, bytes, bytearray)):
            return BundleIn.model_validate_json(data)
        return BundleIn.model_validate(data)
    except ValidationError as exc:
        raise BundleError(f"{source}: {describe(exc)}", problems_of(exc)) from None


def import_bundles(store: Store, bundles: Sequence[BundleIn]) -> dict[str, Any]:
    """Write the bundles' hardware profiles and records in one transaction; returns the counts."""
    records = [NewRecord.of(record) for bundle in bundles for record in bundle.records]
    hardware = [bundle.hardware.model_dump() for bundle in bundles]
    total, changed = store.import_records(records, hardware=hardware)
    return {
        "hardware_id": ",".join(dict.fromkeys(h["hardware_id"] for h in hardware)),
        "records": total,
        "changed": changed,
        "unchanged": total - changed,
    }


def import_bundle(store: Store, data: Any) -> dict[str, Any]:
    """Validate one bundle, then write it (all or nothing); returns the counts."""
    return import_bundles(store, [data if isinstance(data, BundleIn) else parse_bundle(data)])
