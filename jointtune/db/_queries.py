"""SQL the store runs, built once here so `_store` only handles sessions, retries and errors.

Writes are single `INSERT .. ON CONFLICT` statements, which SQLite and PostgreSQL both support:
the database decides atomically whether a new record beats the stored one, so concurrent workers
never lose an update the way read-modify-write would.

Nearest shape: distance = sqrt(sum over dims of (log2 a - log2 b)^2), the sum computed in SQL from
each record's `shape` JSON (the square root in Python). Only records with the same dim names
(`dims_signature`) are comparable: doubling one dim is distance 1, doubling all three of M, N, K
is sqrt(3).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles

from jointtune.db._models import RECORD_KEY, HardwareRow, KernelRow, RecordRow
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


class log2(sa.sql.functions.GenericFunction):
    """log2(x): PostgreSQL spells it ln(x)/ln(2); SQLite gets a Python log2 at connect (_engine.py)."""

    type = sa.Double()
    inherit_cache = True


@compiles(log2, "postgresql")
def _log2_postgresql(element: log2, compiler: Any, **kw: Any) -> str:
    return f"(ln({compiler.process(element.clauses, **kw)}) / ln(2.0))"


def nearest(shape: dict[str, int], clauses: list[sa.ColumnElement[bool]], limit: int) -> sa.Select:
    """(id, squared log2 distance) of the `limit` closest records; ties: lower p50, then lower id.

    The distance is computed from each candidate's own `shape` JSON in one narrow pass over the
    lookup index, and only the winners are read in full afterwards. Summing per-dim rows instead
    made PostgreSQL hash-join the whole dims table (about 30 ms a lookup at 100k records, measured
    with bench/service_load.py's data; this form: about 10 ms). The exact shape scores 0 exactly.
    """
    terms = [(log2(RecordRow.shape[name].as_float()) - math.log2(value)) for name, value in shape.items()]
    dist2 = sa.case(
        (RecordRow.shape_key == shape_key(shape), sa.literal(0.0, sa.Double())),
        else_=sum((t * t for t in terms[1:]), terms[0] * terms[0]),
    ).label("dist2")
    return (
        sa.select(RecordRow.id, dist2)
        .where(*clauses, RecordRow.dims_signature == dims_signature(shape))
        .order_by(dist2, RecordRow.latency_p50_us, RecordRow.id)
        .limit(limit)
    )


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
