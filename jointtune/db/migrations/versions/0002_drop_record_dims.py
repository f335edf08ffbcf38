"""Drop jt_record_dims: the nearest-shape distance is computed from each record's shape JSON.

Summing per-dim rows made PostgreSQL hash-join the whole dims table for every nearest lookup
(about 30 ms at 100k records); reading the candidates' own `shape` in one narrow pass of the lookup
index takes about 10 ms, and the table became derivable state nobody read.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("jt_record_dims")


def downgrade() -> None:
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
    # rows are not rebuilt on downgrade: republish the records to refill them
