"""SQL the store runs, built once here so `_store` only handles sessions, retries and errors.

Writes are single `INSERT .. ON CONFLICT` statements, which SQLite and PostgreSQL both support:
the database decides atomically whether a new record beats the stored one, so concurrent workers
never lose an update the way read-modify-write would.

Nearest shape: distance = sqrt(sum over dims of (log2 a - log2 b)^2), the sum computed in SQL from
each record's `shape` JSON (the square root in Python; `nearest_lookup`). Only records with the same
dim names (`dims_signature`) are comparable: doubling one dim is distance 1, doubling all three of M, N, K
is sqrt(3).
"""

from __future__ import annotations

import functools
import json
import math
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles

from jointtune.canonical import config_hash, shape_key
from jointtune.db._models import RECORD_KEY, HardwareRow, KernelRow, RecordRow
from jointtune.db._values import HardwareProfile, KernelInfo
from jointtune.db.key import RecordKey
from jointtune.db.record import PUBLISHED, RECORD_FIELDS, NewRecord, Record

#: columns a better record replaces: all but the key, the id and `created_at` (from the first insert)
_REPLACED = tuple(name for name in RECORD_FIELDS if name not in (*RECORD_KEY, "id", "created_at"))


def now() -> datetime:
    return datetime.now(timezone.utc)


def _insert(dialect: str, entity: Any) -> Any:
    # Core inserts on the tables: plain upserts, no ORM bulk-insert semantics needed.
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(entity.__table__)


def dims_signature(shape: dict[str, int]) -> str:
    return ",".join(sorted(shape))


def ensure_kernel(dialect: str, name: str, version: str) -> Any:
    return ensure_kernels(dialect, [(name, version)])


def ensure_hardware(dialect: str, hardware_id: str, name: str | None = None) -> Any:
    """A placeholder profile so a record's hardware exists (an existing one, fingerprint and all, stays);
    `upsert_hardware` fills it in later."""
    stmt = _insert(dialect, HardwareRow).values(
        hardware_id=hardware_id, name=name or hardware_id, fingerprint={}, created_at=now()
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


def record_values(record: NewRecord, stamp: datetime) -> dict[str, Any]:
    """The row of a validated record, stamped `stamp` (created_at only matters on insert): its published
    fields (shape sorted, latencies as floats), what the store sets (but the id) and `dims_signature`."""
    values = {name: getattr(record, name) for name in PUBLISHED}
    values.update(
        shape=dict(sorted(record.shape.items())),
        config=dict(record.config),
        latency_p10_us=_float(record.latency_p10_us),
        latency_p50_us=float(record.latency_p50_us),
        latency_p90_us=_float(record.latency_p90_us),
        baseline_us=_float(record.baseline_us),
    )
    stored = {
        "shape_key": shape_key(record.shape),
        "config_hash": config_hash(record.config),
        "speedup": record.baseline_us / record.latency_p50_us if record.baseline_us is not None else None,
        "created_at": stamp,
        "updated_at": stamp,
    }
    return {**values, **stored, "dims_signature": dims_signature(record.shape)}


def upsert_records(dialect: str, rows: list[dict[str, Any]], *, supersede: bool = False) -> Any:
    """Insert, or replace a stored record only if the new p50 is strictly lower; RETURNING id yields
    a row exactly for each record that was stored (ties keep the existing one). One statement for
    many rows (an import): their keys must differ, as PostgreSQL updates a row once per statement.
    `supersede`: a record that its own study stored is replaced whatever the p50s (the study judged
    its pick again, side by side: `tuner.finalists`)."""
    stmt = _insert(dialect, RecordRow).values(rows)
    faster = stmt.excluded.latency_p50_us < stmt.table.c.latency_p50_us
    if supersede:
        faster = faster | (stmt.table.c.study_name == stmt.excluded.study_name)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(RECORD_KEY),
        set_={name: stmt.excluded[name] for name in _REPLACED},
        where=faster,
    )
    return stmt.returning(stmt.table.c.id)


def upsert_record(dialect: str, record: NewRecord, *, supersede: bool = False) -> Any:
    """`upsert_records` for one record."""
    return upsert_records(dialect, [record_values(record, now())], supersede=supersede)


def ensure_kernels(dialect: str, pairs: list[tuple[str, str]]) -> Any:
    stamp = now()
    stmt = _insert(dialect, KernelRow).values([{"name": n, "version": v, "created_at": stamp} for n, v in pairs])
    return stmt.on_conflict_do_nothing(index_elements=["name", "version"])


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


class log2(sa.sql.functions.GenericFunction):
    """log2(x): PostgreSQL spells it ln(x)/ln(2); SQLite gets a Python log2 at connect (_engine.py)."""

    type = sa.Double()
    inherit_cache = True


@compiles(log2, "postgresql")
def _log2_postgresql(element: log2, compiler: Any, **kw: Any) -> str:
    return f"(ln({compiler.process(element.clauses, **kw)}) / ln(2.0))"


class square(sa.sql.functions.GenericFunction):
    """x * x with x evaluated once where the database can: PostgreSQL's power(x, 2) squares without
    computing x's logarithm twice per candidate row (equal to x * x up to the last bit)."""

    type = sa.Double()
    inherit_cache = True


@compiles(square)
def _square(element: square, compiler: Any, **kw: Any) -> str:
    arg = compiler.process(element.clauses, **kw)
    return f"(({arg}) * ({arg}))"


@compiles(square, "postgresql")
def _square_postgresql(element: square, compiler: Any, **kw: Any) -> str:
    return f"power({compiler.process(element.clauses, **kw)}, 2)"


# -- lookups: statements built once, values bound per call -------------------------------------
# A lookup runs for every kernel launch that misses the caller's cache, so its statements are
# built once per shape of query (which dims, versioned or not) and reused: SQLAlchemy then keys its
# compiled cache on the same object instead of building and hashing a new expression tree each time.

_RECORDS = RecordRow.__table__


def _key_clauses(versioned: bool) -> list[sa.ColumnElement[bool]]:
    c = _RECORDS.c
    clauses = [
        c.kernel == sa.bindparam("kernel"),
        c.dtype == sa.bindparam("dtype"),
        c.world_size == sa.bindparam("world_size"),
        c.hardware_id == sa.bindparam("hardware_id"),
        c.timing == sa.bindparam("timing"),
    ]
    if versioned:
        clauses.append(c.kernel_version == sa.bindparam("kernel_version"))
    return clauses


#: the record stored for exactly one key (the unique index answers it)
EXACT = sa.select(_RECORDS).where(*_key_clauses(True), _RECORDS.c.shape_key == sa.bindparam("shape_key"))

#: a key's record made by study `k_study_name`, its trial count raised to `new_trials` (never lowered: the
#: groups of one study tell their trials in any order); `updated_at` stays when the record was replaced.
#: Values: `key_params` with every name prefixed `k_` (an UPDATE reserves the column names for its SET).
RAISE_TRIALS = (
    sa.update(_RECORDS)
    .where(
        *(_RECORDS.c[name] == sa.bindparam(f"k_{name}") for name in RECORD_KEY),
        _RECORDS.c.study_name == sa.bindparam("k_study_name"),
        _RECORDS.c.trials < sa.bindparam("new_trials"),
    )
    .values(trials=sa.bindparam("new_trials"))
)


def key_params(key: RecordKey) -> dict[str, Any]:
    """Values for `EXACT` and `nearest_lookup` of a checked key (kernel_version only when given)."""
    params = {name: getattr(key, name) for name in RECORD_KEY if name not in ("kernel_version", "shape_key")}
    params["shape_key"] = shape_key(key.shape)
    if key.kernel_version is not None:
        params["kernel_version"] = key.kernel_version
    return params


@functools.lru_cache(maxsize=256)
def nearest_lookup(dims: tuple[str, ...], versioned: bool) -> sa.Select:
    """Full records of the `limit` closest shapes, with their squared log2 distance `dist2`, closest
    first; ties: lower p50, then lower id. Values: `key_params` plus `nearest_params`.

    The distance is computed from each candidate's own `shape` JSON in one narrow pass over the
    lookup index (a subquery of ids and distances, sorted), and only the winners are joined back
    for their full rows in the same statement (so a winner deleted meanwhile can't fail the lookup,
    as it could when ranking and reading were two statements). Summing per-dim rows instead made PostgreSQL
    hash-join the whole dims table (about 30 ms a lookup at 100k records, measured with
    bench/service/service_load.py's data); sorting full rows instead of ids costs 1-2 ms more at 2,500
    candidates. The exact shape scores 0 exactly. Dims are summed in the query's order, as
    `distance` has always been computed.
    """
    c = _RECORDS.c
    terms = [
        square(log2(c.shape[name].as_float()) - sa.bindparam(f"log2_{i}", type_=sa.Double()))
        for i, name in enumerate(dims)
    ]
    dist2 = sa.case(
        (c.shape_key == sa.bindparam("shape_key"), sa.literal(0.0, sa.Double())),
        else_=sum(terms[1:], terms[0]),
    ).label("dist2")
    ranked = (
        sa.select(c.id, dist2, c.latency_p50_us)
        .where(*_key_clauses(versioned), c.dims_signature == sa.bindparam("dims_signature"))
        .order_by(dist2, c.latency_p50_us, c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
        .subquery("ranked")
    )
    return (
        sa.select(_RECORDS, ranked.c.dist2)
        .join_from(_RECORDS, ranked, _RECORDS.c.id == ranked.c.id)
        .order_by(ranked.c.dist2, ranked.c.latency_p50_us, ranked.c.id)
    )


def nearest_params(shape: dict[str, int], limit: int) -> dict[str, Any]:
    """The per-query values of `nearest_lookup(tuple(shape), ...)` beyond `key_params`."""
    params: dict[str, Any] = {f"log2_{i}": math.log2(value) for i, value in enumerate(shape.values())}
    params["dims_signature"] = dims_signature(shape)
    params["limit"] = limit
    return params


#: the columns `key_values` may read and filter on: the lookup index's, the version, and the hardware
KEY_VALUE_COLUMNS = ("kernel", "hardware_id", "dtype", "world_size", "timing", "dims_signature", "kernel_version")


@functools.lru_cache(maxsize=64)
def key_values(columns: tuple[str, ...], filtered: tuple[str, ...]) -> sa.Select:
    """The distinct values of `columns` among the records whose `filtered` columns equal their bound values,
    in order, at most `limit` (bound) of them. Filters on a prefix of the lookup index read only its range."""
    cols = [_RECORDS.c[name] for name in columns]
    where = [_RECORDS.c[name] == sa.bindparam(name) for name in filtered]
    return sa.select(*cols).where(*where).distinct().order_by(*cols).limit(sa.bindparam("limit", type_=sa.Integer()))


@functools.lru_cache(maxsize=8)
def names(table: str, of_kernel: bool) -> tuple[sa.Select, sa.Select]:
    """(the first `limit` names, how many there are) of hardware profiles (`table` "hardware": all of them, or
    those with records of the bound `kernel` where `of_kernel`) or of kernels with records ("kernels"). A name
    is checked with one probe of the lookup index, whatever the number of records."""
    records = _RECORDS.c
    if table == "hardware":
        column = HardwareRow.__table__.c.hardware_id
        where = [sa.exists().where(records.kernel == sa.bindparam("kernel"), records.hardware_id == column)]
        where = where if of_kernel else []
    else:
        column = KernelRow.__table__.c.name
        where = [sa.exists().where(records.kernel == column)]
    matching = sa.select(column).where(*where).distinct().subquery()
    page = sa.select(matching.c[0]).order_by(matching.c[0]).limit(sa.bindparam("limit", type_=sa.Integer()))
    total = sa.select(sa.func.count()).select_from(matching)
    return page, total


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def export_json(*, hardware_id: str, kernel: str | None, after: int, limit: int) -> sa.Select:
    """Id and published fields, in order, of a page of a hardware's records; `shape` and `config` as the
    database's JSON text."""
    c = _RECORDS.c
    columns = [sa.cast(c[n], sa.Text).label(n) if n in ("shape", "config") else c[n] for n in PUBLISHED]
    where = [c.hardware_id == hardware_id, c.id > after, *([c.kernel == kernel] if kernel is not None else [])]
    return sa.select(c.id, *columns).where(*where).order_by(c.id).limit(limit)


_SCALARS = tuple(name for name in PUBLISHED if name not in ("shape", "config"))


def export_text(row: sa.Row[Any]) -> str:
    """A row of `export_json` as the JSON object of its NewRecord fields: the scalars encoded in one
    call, the database's own JSON text of shape and config spliced in front of them."""
    scalars = _encode({name: getattr(row, name) for name in _SCALARS})
    return '{"shape":' + row.shape + ',"config":' + row.config + "," + scalars[1:]


def filters(**given: Any) -> list[sa.ColumnElement[bool]]:
    """Equality filters on record columns for the arguments that are not None."""
    return [getattr(RecordRow, name) == value for name, value in given.items() if value is not None]


def distance(dist2: float) -> float:
    return math.sqrt(max(float(dist2), 0.0))


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC text); PostgreSQL aware ones.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


#: Record fields read from a row as they are; `to_record` converts the others
_AS_READ = tuple(name for name in RECORD_FIELDS if name not in ("shape", "config", "created_at", "updated_at"))


def to_record(row: RecordRow | sa.Row[Any]) -> Record:
    """A Record from an ORM row or a Core row of the records table (same attribute names)."""
    return Record(
        **{name: getattr(row, name) for name in _AS_READ},
        shape={name: int(value) for name, value in row.shape.items()},
        config=dict(row.config),
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
    )


def to_hardware(row: HardwareRow) -> HardwareProfile:
    return HardwareProfile(
        hardware_id=row.hardware_id, name=row.name, fingerprint=dict(row.fingerprint), created_at=_utc(row.created_at)
    )


def to_kernel(row: KernelRow) -> KernelInfo:
    return KernelInfo(name=row.name, version=row.version, created_at=_utc(row.created_at))
