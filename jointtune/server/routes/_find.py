"""The lookup's query plan: exact key first, then the nearest shape, cheap enough for 500+ lookups/s.

Measured on 100k records (bench/service_load.py): `Store.nearest` joins every candidate's rows of
`jt_record_dims`, and PostgreSQL answers that with a scan of the whole dims table (~55 ms per
lookup, exact or not). So:
- With a kernel_version (what the decorator sends), an exact shape is one probe of the records'
  unique key (`Store.best`).
- Otherwise, on PostgreSQL, the distance is computed from each candidate's `shape` JSONB in one
  narrow scan of the lookup index (no join), and only the winner is read in full. Ordering is the
  store's: distance, then p50, then id; distances are rounded to 1e-9 so float noise between the
  database's `ln` and Python's `log2` cannot reorder true ties, and the exact shape is distance 0.
- On SQLite (one node, small stores) `Store.nearest` is used as it is.
"""

from __future__ import annotations

import math

import sqlalchemy as sa

from jointtune.db import Record, Store, shape_key
from jointtune.errors import StoreError


def find(
    store: Store,
    *,
    kernel: str,
    kernel_version: str | None,
    shape: dict[str, int],
    dtype: str,
    world_size: int,
    hardware_id: str,
) -> tuple[Record, float] | None:
    """The best record for the key: exact shape (distance 0) or the nearest one, or None."""
    key = {"kernel": kernel, "dtype": dtype, "world_size": world_size, "hardware_id": hardware_id}
    if kernel_version is not None:
        record = store.best(kernel_version=kernel_version, shape=shape, **key)
        if record is not None:
            return record, 0.0
    if store.backend != "postgresql":
        found = store.nearest(kernel_version=kernel_version, shape=shape, limit=1, **key)
        return found[0] if found else None
    best = _nearest_id(store, kernel_version=kernel_version, shape=shape, **key)
    if best is None:
        return None
    record_id, dist2 = best
    record = store.get_record(record_id)
    if record is None:  # deleted between the two reads: answer as the store would now
        found = store.nearest(kernel_version=kernel_version, shape=shape, limit=1, **key)
        return found[0] if found else None
    return record, math.sqrt(max(dist2, 0.0))


def _nearest_id(
    store: Store,
    *,
    kernel: str,
    kernel_version: str | None,
    shape: dict[str, int],
    dtype: str,
    world_size: int,
    hardware_id: str,
) -> tuple[int, float] | None:
    names = sorted(shape)
    params: dict[str, object] = {
        "kernel": kernel,
        "dtype": dtype,
        "world_size": world_size,
        "hardware_id": hardware_id,
        "signature": ",".join(names),
        "shape_key": shape_key(shape),
    }
    terms = []
    for i, name in enumerate(names):
        params[f"d{i}"], params[f"l{i}"] = name, math.log2(shape[name])
        terms.append(f"power(ln((shape ->> :d{i})::float8) / ln(2.0::float8) - :l{i}, 2)")
    version = ""
    if kernel_version is not None:
        version, params["kernel_version"] = " AND kernel_version = :kernel_version", kernel_version
    sql = sa.text(
        "SELECT id, dist2 FROM (SELECT id, latency_p50_us, CASE WHEN shape_key = :shape_key THEN 0 "
        f"ELSE round(({' + '.join(terms)})::numeric, 9) END AS dist2 FROM jt_records "
        "WHERE kernel = :kernel AND hardware_id = :hardware_id AND dtype = :dtype AND world_size = :world_size "
        f"AND dims_signature = :signature{version}) AS candidates "
        "ORDER BY dist2, latency_p50_us, id LIMIT 1"
    )
    try:
        with store.engine.connect() as conn:
            row = conn.execute(sql, params).first()
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"database {store.display_url}: finding the nearest shapes failed") from exc
    return None if row is None else (int(row[0]), float(row[1]))
