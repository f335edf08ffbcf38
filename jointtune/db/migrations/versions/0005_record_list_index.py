"""An index in the order records are listed (kernel, version, hardware, dtype, world size, shape, id).

`GET /v1/configs` and the dashboard read records a page at a time in that order. Without an index
PostgreSQL sorted the whole table for every page: 76 ms for the first 250 of 100k records, 1.1 s for
the last (bench/service_load.py's data); with it the first page reads 250 index entries (0.4 ms) and a
deep page walks the index up to its offset (93 ms at 99k).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS = ["kernel", "kernel_version", "hardware_id", "dtype", "world_size", "shape_key", "id"]


def upgrade() -> None:
    op.create_index("ix_jt_records_list", "jt_records", _COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_jt_records_list", table_name="jt_records")
