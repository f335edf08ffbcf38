"""The store's tables as SQLAlchemy 2 typed models; the Alembic migrations create exactly these.

Why these tables, and not more:
- Trial history lives only in Optuna's RDB storage on the same database URL; a record keeps
  `study_name` to find its study. One source of truth for trials, Optuna owns that schema and its
  migrations, and we keep only the winners, which is what kernels ask for at run time.
- Every table name starts with `jt_`, and our Alembic version table is `jt_alembic_version`,
  because Optuna's tables (`studies`, `trials`, ... and its own `alembic_version`) share the
  database.
- The nearest-shape distance reads each candidate's `shape` JSON (`_queries.nearest_lookup`);
  `dims_signature` ("K,M,N") picks the records whose dims are comparable before any arithmetic.
  (Revision 0001 also kept one row per dim in `jt_record_dims`; 0002 dropped it, see there.)
- Records name their kernel and hardware by value (the unique key reads as the issue states it)
  with foreign keys to `jt_kernels` and `jt_hardware_profiles`, which the store fills on publish.

Relationships are `lazy="raise"`: the store returns plain dataclasses, and an accidental lazy
load outside its session must fail loudly instead of issuing hidden queries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jointtune.db.record import KEY_FIELDS

#: stable constraint names, so later migrations can refer to them on every backend
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON everywhere; JSONB on PostgreSQL (compact, comparable, indexable)
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: Alembic's version table for our schema (Optuna's `alembic_version` shares the database)
VERSION_TABLE = "jt_alembic_version"

#: the columns that identify a record: one best config per key (the key's fields, the shape as its canonical text)
RECORD_KEY = tuple("shape_key" if name == "shape" else name for name in KEY_FIELDS)
#: the order records are listed in, a page at a time
LIST_ORDER = ("kernel", "kernel_version", "hardware_id", "dtype", "world_size", "shape_key", "id")


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSONType,
        datetime: sa.DateTime(timezone=True),
        float: sa.Double(),
    }


class HardwareRow(Base):
    """One machine type: its id (a hash of the fingerprint), a readable name and the fingerprint."""

    __tablename__ = "jt_hardware_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    hardware_id: Mapped[str] = mapped_column(sa.String(128), unique=True)
    name: Mapped[str] = mapped_column(sa.String(256))
    fingerprint: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class KernelRow(Base):
    """A kernel name at one source version; tuned configs never carry over between versions."""

    __tablename__ = "jt_kernels"
    __table_args__ = (sa.UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(128))
    version: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime]


class RecordRow(Base):
    """The best config found so far for one key, with its latency and provenance."""

    __tablename__ = "jt_records"
    __table_args__ = (
        sa.UniqueConstraint(*RECORD_KEY, name="uq_jt_records_key"),
        sa.ForeignKeyConstraint(
            ["kernel", "kernel_version"],
            ["jt_kernels.name", "jt_kernels.version"],
            name="fk_jt_records_kernel_jt_kernels",
        ),
        sa.Index("ix_jt_records_lookup", "kernel", "hardware_id", "dtype", "world_size", "timing", "dims_signature"),
        # the order of `Store.list_records` (GET /v1/configs, the dashboard): a page reads the index, not a sort
        sa.Index("ix_jt_records_list", *LIST_ORDER),
        # SQLite would give a deleted record's id to the next one; an id must name one record, ever
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(sa.String(128))
    kernel_version: Mapped[str] = mapped_column(sa.String(64))
    space_version: Mapped[str] = mapped_column(sa.String(64))
    shape: Mapped[dict[str, Any]]
    shape_key: Mapped[str] = mapped_column(sa.String(512))
    dims_signature: Mapped[str] = mapped_column(sa.String(512))
    dtype: Mapped[str] = mapped_column(sa.String(32))
    world_size: Mapped[int]
    hardware_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("jt_hardware_profiles.hardware_id"), index=True
    )
    triton_version: Mapped[str] = mapped_column(sa.String(16))
    #: the timing policy the latency was measured under (gpu, eager, graph, interp): part of the key
    timing: Mapped[str] = mapped_column(sa.String(8), server_default="gpu")
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(sa.String(64))
    latency_p10_us: Mapped[float | None]
    latency_p50_us: Mapped[float]
    latency_p90_us: Mapped[float | None]
    baseline_us: Mapped[float | None]
    speedup: Mapped[float | None]
    trials: Mapped[int]
    study_name: Mapped[str | None] = mapped_column(sa.String(256))
    tuner_version: Mapped[str] = mapped_column(sa.String(32))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class QuarantineRow(Base):
    """A row the store took before its schema (revision 0003) but could not serve back, kept as the
    text the database held and why it was moved, so reads work again and nothing is lost."""

    __tablename__ = "jt_quarantine"

    id: Mapped[int] = mapped_column(primary_key=True)
    source_table: Mapped[str] = mapped_column(sa.String(64))
    source_id: Mapped[int]
    reason: Mapped[str] = mapped_column(sa.Text())
    data: Mapped[str] = mapped_column(sa.Text())
    quarantined_at: Mapped[datetime]
