"""Records carry the timing policy they were measured under (gpu, eager, graph), and it joins their key.

A config that wins GPU time can lose when called eagerly (host-bound launches) or win by more inside a
CUDA graph, so the store keeps one record per policy for a key and lookups ask for one. Every record made
before this revision was timed on the GPU alone (a device-side hold, events around the call): it becomes
`gpu`, and stays the record of its key. The lookup index gains the column before `dims_signature`, so a
nearest lookup still reads only comparable records.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD_KEY = ["kernel", "kernel_version", "shape_key", "dtype", "world_size", "hardware_id"]
_OLD_LOOKUP = ["kernel", "hardware_id", "dtype", "world_size", "dims_signature"]


def _sqlite_sequence() -> int | None:
    """SQLite's AUTOINCREMENT high-water mark of jt_records (None elsewhere): a batch rebuild of the table
    resets it to the largest id still present, and a deleted record's id would be handed out again."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return None
    return conn.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'jt_records'")).scalar()


def _restore_sqlite_sequence(seq: int | None) -> None:
    if seq is not None:
        op.get_bind().execute(
            sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :seq) WHERE name = 'jt_records'"), {"seq": seq}
        )


def upgrade() -> None:
    seq = _sqlite_sequence()
    with op.batch_alter_table("jt_records", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("timing", sa.String(8), nullable=False, server_default="gpu"))
        batch.drop_constraint("uq_jt_records_key", type_="unique")
        batch.create_unique_constraint("uq_jt_records_key", [*_OLD_KEY, "timing"])
        batch.drop_index("ix_jt_records_lookup")
        batch.create_index("ix_jt_records_lookup", ["kernel", "hardware_id", "dtype", "world_size", "timing",
                                                    "dims_signature"])  # fmt: skip
    _restore_sqlite_sequence(seq)


def downgrade() -> None:
    # The old key has room for one record per key: keep the gpu ones (what the old code measured).
    op.execute(sa.text("DELETE FROM jt_records WHERE timing <> 'gpu'"))
    seq = _sqlite_sequence()
    with op.batch_alter_table("jt_records", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index("ix_jt_records_lookup")
        batch.create_index("ix_jt_records_lookup", _OLD_LOOKUP)
        batch.drop_constraint("uq_jt_records_key", type_="unique")
        batch.create_unique_constraint("uq_jt_records_key", _OLD_KEY)
        batch.drop_column("timing")
    _restore_sqlite_sequence(seq)
