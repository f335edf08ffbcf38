"""SQL the store runs, built once here so `_store` only handles sessions, retries and errors.

Writes are single `INSERT .. ON CONFLICT` statements, which SQLite and PostgreSQL both support:
the database decides atomically whether a new record beats the stored one, so concurrent workers
never lose an update the way read-modify-write would.

Nearest shape: distance = sqrt(sum over dims of (log2 a - log2 b)^2), computed in SQL from
`jt_record_dims` (the square root in Python; SQLite may lack math functions). Only records with
the same dim names (`dims_signature`) are comparable: doubling one dim is distance 1, doubling
all three of M, N, K is sqrt(3).
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from jointtune.db._models import RECORD_KEY, HardwareRow, KernelRow, RecordDimRow, RecordRow
from jointtune.db._values import HardwareProfile, KernelInfo, NewRecord, Record, config_hash, shape_key

#: columns a better record replaces; `created_at` stays from the first insert
_REPLACED = (
    "space_version",
    "shape",
    "triton_version",
    "config",
    "config_hash",
    "latency_p10_us",
    "latency_p50_us",
    "latency_p90_us",
    "baseline_us",
    "speedup",
    "trials",
    "study_name",
    "tuner_version",
    "updated_at",
)


def now() -> datetime:
    return datetime.now(timezone.utc)


def _insert(dialect: str, entity: Any) -> Any:
    # Core inserts on the tables: plain upserts, no ORM bulk-insert semantics needed.
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(entity.__table__)


def dims_signature(shape: dict[str, int]) -> str:
    return ",".join(sorted(shape))


def ensure_kernel(dialect: str, name: str, version: str) -> Any:
    stmt = _insert(dialect, KernelRow).values(name=name, version=version, created_at=now())
    return stmt.on_conflict_do_nothing(index_elements=["name", "version"])


def ensure_hardware(dialect: str, hardware_id: str) -> Any:
    """A placeholder profile so a record's hardware exists; `upsert_hardware` fills it in later."""
    stmt = _insert(dialect, HardwareRow).values(
        hardware_id=hardware_id, name=hardware_id, fingerprint={}, created_at=now()
    )
    return stmt.on_conflict_do_nothing(index_elements=["hardware_id"])


def upsert_hardware(dialect: str, hardware_id: str, name: str, fingerprint: dict[str, Any]) -> Any:
    stmt = _insert(dialect, HardwareRow).values(
        hardware_id=hardware_id, name=name, fingerprint=fingerprint, created_at=now()
    )
    return stmt.on_conflict_do_update(
        index_elements=["hardware_id"],
        set_={"name": stmt.excluded.name, "fingerprint": stmt.excluded.fingerprint},
    )


def upsert_record(dialect: str, record: NewRecord) -> Any:
    """Insert, or replace the stored record only if the new p50 is strictly lower; RETURNING id
    yields a row exactly when the new record was stored (ties keep the existing one)."""
    stamp = now()
    speedup = record.baseline_us / record.latency_p50_us if record.baseline_us is not None else None
    values = {
        "kernel": record.kernel,
        "kernel_version": record.kernel_version,
        "space_version": record.space_version,
        "shape": dict(sorted(record.shape.items())),
        "shape_key": shape_key(record.shape),
        "dims_signature": dims_signature(record.shape),
        "dtype": record.dtype,
        "world_size": record.world_size,
        "hardware_id": record.hardware_id,
        "triton_version": record.triton_version,
        "config": dict(record.config),
        "config_hash": config_hash(record.config),
        "latency_p10_us": _float(record.latency_p10_us),
        "latency_p50_us": float(record.latency_p50_us),
        "latency_p90_us": _float(record.latency_p90_us),
        "baseline_us": _float(record.baseline_us),
        "speedup": speedup,
        "trials": record.trials,
        "study_name": record.study_name,
        "tuner_version": record.tuner_version,
        "created_at": stamp,
        "updated_at": stamp,
    }
    stmt = _insert(dialect, RecordRow).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(RECORD_KEY),
        set_={name: stmt.excluded[name] for name in _REPLACED},
        where=stmt.excluded.latency_p50_us < stmt.table.c.latency_p50_us,
    )
    return stmt.returning(stmt.table.c.id)


def insert_dims(dialect: str, record_id: int, shape: dict[str, int]) -> Any:
    rows = [
        {"record_id": record_id, "name": name, "value": value, "log2": math.log2(value)}
        for name, value in shape.items()
    ]
    return _insert(dialect, RecordDimRow).values(rows).on_conflict_do_nothing()


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def key_filter(
    *, kernel: str, kernel_version: str | None, dtype: str, world_size: int, hardware_id: str
) -> list[sa.ColumnElement[bool]]:
    clauses = [
        RecordRow.kernel == kernel,
        RecordRow.dtype == dtype,
        RecordRow.world_size == world_size,
        RecordRow.hardware_id == hardware_id,
    ]
    if kernel_version is not None:
        clauses.append(RecordRow.kernel_version == kernel_version)
    return clauses


def nearest_candidates(shape: dict[str, int], clauses: list[sa.ColumnElement[bool]]) -> sa.Select:
    """Narrow (id, p50, shape) rows of every record comparable with `shape`, from the lookup index.

    The distance is ranked in Python (`rank_nearest`): a few thousand narrow rows cost ~1 ms there,
    while summing per-dim rows in SQL made PostgreSQL hash-join the whole dims table (about 30 ms
    per lookup at 100k records, measured with bench/service_load.py's data).
    """
    return sa.select(RecordRow.id, RecordRow.latency_p50_us, RecordRow.shape).where(
        *clauses, RecordRow.dims_signature == dims_signature(shape)
    )


def rank_nearest(shape: dict[str, int], rows: Any, limit: int) -> list[tuple[int, float]]:
    """(id, squared log2 distance) of the `limit` closest rows; ties: lower p50, then lower id."""
    target = [(name, math.log2(value)) for name, value in shape.items()]
    scored = (
        (sum((math.log2(int(row_shape[name])) - t) ** 2 for name, t in target), p50, rid)
        for rid, p50, row_shape in rows
    )
    return [(rid, dist2) for dist2, _, rid in heapq.nsmallest(limit, scored)]


def filters(**given: Any) -> list[sa.ColumnElement[bool]]:
    """Equality filters on record columns for the arguments that are not None."""
    return [getattr(RecordRow, name) == value for name, value in given.items() if value is not None]


def distance(dist2: float) -> float:
    return math.sqrt(max(float(dist2), 0.0))


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC text); PostgreSQL aware ones.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def to_record(row: RecordRow) -> Record:
    return Record(
        id=row.id,
        kernel=row.kernel,
        kernel_version=row.kernel_version,
        space_version=row.space_version,
        shape={name: int(value) for name, value in row.shape.items()},
        shape_key=row.shape_key,
        dtype=row.dtype,
        world_size=row.world_size,
        hardware_id=row.hardware_id,
        triton_version=row.triton_version,
        config=dict(row.config),
        config_hash=row.config_hash,
        latency_p10_us=row.latency_p10_us,
        latency_p50_us=row.latency_p50_us,
        latency_p90_us=row.latency_p90_us,
        baseline_us=row.baseline_us,
        speedup=row.speedup,
        trials=row.trials,
        study_name=row.study_name,
        tuner_version=row.tuner_version,
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
    )


def to_hardware(row: HardwareRow) -> HardwareProfile:
    return HardwareProfile(
        hardware_id=row.hardware_id, name=row.name, fingerprint=dict(row.fingerprint), created_at=_utc(row.created_at)
    )


def to_kernel(row: KernelRow) -> KernelInfo:
    return KernelInfo(name=row.name, version=row.version, created_at=_utc(row.created_at))
