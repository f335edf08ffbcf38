"""Rows the store can't serve back move to `jt_quarantine`; dtype aliases become torch's names.

Before this revision the store took records it could not read back (issue 17): a config nested
hundreds of levels deep or holding a lone surrogate, Infinity/NaN (SQLite), a dim beyond what
PostgreSQL's double precision takes, names no URL can reach. Each broke every read that touched it
(exact and nearest lookups, list pages, exports, the dashboard) until someone deleted it by an id
the list did not show. From now on the store only takes what its schema (`jointtune.db.schema`)
allows; this revision applies the same schema to what is already stored:

- a record the schema refuses is moved, as the text the database holds, to `jt_quarantine` with the
  reason, so every read works again and nothing is lost (an admin can read it there);
- a record stored under a dtype alias ("bf16") is renamed to torch's name ("bfloat16"), which
  lookups now ask for; where the key already has a record under that name, the faster one stays
  and the other is quarantined;
- a hardware profile whose name or fingerprint the schema refuses keeps its id with its name set to
  the id and an empty fingerprint (the original quarantined); a profile or kernel whose own id is
  refused is quarantined once no record refers to it.

On SQLite, `jt_records` is rebuilt with AUTOINCREMENT: SQLite gave the id of a deleted newest
record to the next record published, so an id a client kept could name another record
(PostgreSQL's sequence never reuses one). Records the schema accepts are untouched otherwise. The
schema is read from the package, so this revision applies the rules of the jointtune that runs it.
Downgrading drops the quarantine table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from alembic import op
from pydantic import TypeAdapter, ValidationError

from jointtune.db.schema import HardwareIn, Name64, Name128, RecordIn, describe

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_JSON_COLUMNS = ("shape", "config", "fingerprint")
_BATCH = 1000
_NAME128 = TypeAdapter(Name128)
_NAME64 = TypeAdapter(Name64)


def upgrade() -> None:
    op.create_table(
        "jt_quarantine",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source_table", sa.String(64), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jt_quarantine"),
    )
    conn = op.get_bind()
    if conn.dialect.name == "sqlite":
        with op.batch_alter_table("jt_records", recreate="always", table_kwargs={"sqlite_autoincrement": True}):
            pass
    tables = _tables(conn)
    _records(conn, tables)
    _hardware(conn, tables)
    _kernels(conn, tables)


def downgrade() -> None:
    op.drop_table("jt_quarantine")


def _tables(conn: sa.Connection) -> dict[str, sa.Table]:
    meta = sa.MetaData()
    return {name: sa.Table(name, meta, autoload_with=conn) for name in
            ("jt_records", "jt_hardware_profiles", "jt_kernels", "jt_quarantine")}  # fmt: skip


def _rows(conn: sa.Connection, table: sa.Table) -> Any:
    """Every row by id, a batch at a time, JSON columns as the database's own text (parsed here, so
    a value the driver can't load is a reason to quarantine, not a failed migration)."""
    columns = [sa.cast(c, sa.Text).label(c.name) if c.name in _JSON_COLUMNS else c for c in table.c]
    after = 0
    while True:
        batch = conn.execute(sa.select(*columns).where(table.c.id > after).order_by(table.c.id).limit(_BATCH)).all()
        yield from batch
        if len(batch) < _BATCH:
            return
        after = batch[-1].id


def _parse(row: Any, names: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    data = dict(row._mapping)
    for name in names:
        try:
            data[name] = json.loads(data[name])
        except (ValueError, RecursionError) as exc:
            return data, f"{name}: its JSON can't be read back ({type(exc).__name__})"
    return data, None


def _quarantine(conn: sa.Connection, tables: dict[str, sa.Table], source: str, row: Any, reason: str) -> None:
    data = json.dumps(dict(row._mapping), default=str, ensure_ascii=True)  # ASCII: holds any text it was given
    conn.execute(
        sa.insert(tables["jt_quarantine"]).values(
            source_table=source,
            source_id=row.id,
            reason=reason[:4000],
            data=data,
            quarantined_at=datetime.now(timezone.utc),
        )
    )


def _refused(model: Any, data: dict[str, Any]) -> tuple[Any, str | None]:
    try:
        return model.model_validate(data), None
    except ValidationError as exc:
        return None, describe(exc).encode("utf-8", "backslashreplace").decode()
    except RecursionError:
        return None, "nested too deeply to validate"


def _records(conn: sa.Connection, tables: dict[str, sa.Table]) -> None:
    records = tables["jt_records"]
    fields = set(RecordIn.model_fields)
    for row in _rows(conn, records):
        data, reason = _parse(row, ("shape", "config"))
        checked = None
        if reason is None:
            checked, reason = _refused(RecordIn, {k: v for k, v in data.items() if k in fields})
        if reason is not None:
            _quarantine(conn, tables, "jt_records", row, reason)
            conn.execute(sa.delete(records).where(records.c.id == row.id))
        elif checked.dtype != row.dtype:
            _rename_dtype(conn, tables, row, checked.dtype)


def _rename_dtype(conn: sa.Connection, tables: dict[str, sa.Table], row: Any, dtype: str) -> None:
    records = tables["jt_records"]
    c = records.c
    key = [c.kernel == row.kernel, c.kernel_version == row.kernel_version, c.shape_key == row.shape_key,
           c.world_size == row.world_size, c.hardware_id == row.hardware_id, c.dtype == dtype]  # fmt: skip
    other = conn.execute(sa.select(records).where(*key)).first()
    if other is not None and other.latency_p50_us <= row.latency_p50_us:
        reason = f"dtype {row.dtype!r}: record {other.id} of the same key under {dtype!r} is as fast or faster"
        _quarantine(conn, tables, "jt_records", row, reason)
        conn.execute(sa.delete(records).where(c.id == row.id))
        return
    if other is not None:
        reason = f"dtype {dtype!r}: record {row.id} of the same key under {row.dtype!r} is faster"
        _quarantine(conn, tables, "jt_records", other, reason)
        conn.execute(sa.delete(records).where(c.id == other.id))
    conn.execute(sa.update(records).where(c.id == row.id).values(dtype=dtype))


def _hardware(conn: sa.Connection, tables: dict[str, sa.Table]) -> None:
    hardware, records = tables["jt_hardware_profiles"], tables["jt_records"]
    for row in _rows(conn, hardware):
        data, reason = _parse(row, ("fingerprint",))
        if reason is None:
            _, reason = _refused(HardwareIn, {k: data[k] for k in ("hardware_id", "name", "fingerprint")})
        if reason is None:
            continue
        _quarantine(conn, tables, "jt_hardware_profiles", row, reason)
        try:
            _NAME128.validate_python(row.hardware_id)
        except ValidationError:
            used = conn.execute(sa.select(records.c.id).where(records.c.hardware_id == row.hardware_id)).first()
            if used is None:
                conn.execute(sa.delete(hardware).where(hardware.c.id == row.id))
                continue
        conn.execute(sa.update(hardware).where(hardware.c.id == row.id).values(name=row.hardware_id, fingerprint={}))


def _kernels(conn: sa.Connection, tables: dict[str, sa.Table]) -> None:
    kernels, records = tables["jt_kernels"], tables["jt_records"]
    for row in _rows(conn, kernels):
        try:
            _NAME128.validate_python(row.name)
            _NAME64.validate_python(row.version)
            continue
        except ValidationError:
            pass
        used = records.c.kernel == row.name, records.c.kernel_version == row.version
        if conn.execute(sa.select(records.c.id).where(*used)).first() is None:
            _quarantine(conn, tables, "jt_kernels", row, "name or version outside the name charset")
            conn.execute(sa.delete(kernels).where(kernels.c.id == row.id))
