"""Initial schema: hardware profiles, kernels, tuning records and their dims.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jt_hardware_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("fingerprint", _JSON, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jt_hardware_profiles"),
        sa.UniqueConstraint("hardware_id", name="uq_jt_hardware_profiles_hardware_id"),
    )
    op.create_table(
        "jt_kernels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jt_kernels"),
        sa.UniqueConstraint("name", "version", name="uq_jt_kernels_name_version"),
    )
    op.create_table(
        "jt_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("kernel_version", sa.String(64), nullable=False),
        sa.Column("space_version", sa.String(64), nullable=False),
        sa.Column("shape", _JSON, nullable=False),
        sa.Column("shape_key", sa.String(512), nullable=False),
        sa.Column("dims_signature", sa.String(512), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.String(128), nullable=False),
        sa.Column("triton_version", sa.String(16), nullable=False),
        sa.Column("config", _JSON, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("latency_p10_us", sa.Double(), nullable=True),
        sa.Column("latency_p50_us", sa.Double(), nullable=False),
        sa.Column("latency_p90_us", sa.Double(), nullable=True),
        sa.Column("baseline_us", sa.Double(), nullable=True),
        sa.Column("speedup", sa.Double(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.String(256), nullable=True),
        sa.Column("tuner_version", sa.String(32), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jt_records"),
        sa.ForeignKeyConstraint(
            ["kernel", "kernel_version"],
            ["jt_kernels.name", "jt_kernels.version"],
            name="fk_jt_records_kernel_jt_kernels",
        ),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["jt_hardware_profiles.hardware_id"],
            name="fk_jt_records_hardware_id_jt_hardware_profiles",
        ),
        sa.UniqueConstraint(
            "kernel",
            "kernel_version",
            "shape_key",
            "dtype",
            "world_size",
            "hardware_id",
            name="uq_jt_records_key",
        ),
    )
    op.create_index("ix_jt_records_hardware_id", "jt_records", ["hardware_id"])
    op.create_index(
        "ix_jt_records_lookup", "jt_records", ["kernel", "hardware_id", "dtype", "world_size", "dims_signature"]
    )
    op.create_table(
        "jt_record_dims",
        sa.Column("record_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("log2", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("record_id", "name", name="pk_jt_record_dims"),
        sa.ForeignKeyConstraint(
            ["record_id"], ["jt_records.id"], name="fk_jt_record_dims_record_id_jt_records", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("jt_record_dims")
    op.drop_index("ix_jt_records_lookup", table_name="jt_records")
    op.drop_index("ix_jt_records_hardware_id", table_name="jt_records")
    op.drop_table("jt_records")
    op.drop_table("jt_kernels")
    op.drop_table("jt_hardware_profiles")
