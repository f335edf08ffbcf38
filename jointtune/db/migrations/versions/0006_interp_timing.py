"""Records measured in Triton's CPU interpreter say so: timing `interp`, not `gpu` or `eager`.

Until this revision a tuning run on a machine without a GPU stored its records under the policy it was
asked for (`gpu` by default), though what it timed was the interpreter's wall time, and every view said
"timing gpu". From now on the tuner records such measurements as `interp` (`jointtune.timings.measured_as`);
this revision relabels the records already stored for the interpreter's hardware ids. Where one key has
a gpu and an eager record there (the same measurement, twice), the faster stays (ties: the older id) and
the other goes. Downgrading makes them gpu records again, as the older code wrote them (where the key has no
gpu record already).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: the interpreter's hardware ids (`jointtune.timings.INTERPRETER_ID_PREFIX`, as of this revision)
_ON_CPU = "hardware_id LIKE 'cpu-interpreter-%'"
_SAME_KEY = " AND ".join(
    f"o.{c} = jt_records.{c}" for c in ("kernel", "kernel_version", "shape_key", "dtype", "world_size", "hardware_id")
)


def _keep_fastest(timings: str, beaten_by: str) -> None:
    """Delete each interpreter record of policy `timings` that another record of its key (policy `beaten_by`)
    beats: lower p50, or the same and an older id."""
    op.execute(
        sa.text(
            f"DELETE FROM jt_records WHERE {_ON_CPU} AND timing IN ({timings}) AND EXISTS (SELECT 1 FROM jt_records o "
            f"WHERE {_SAME_KEY} AND o.timing IN ({beaten_by}) AND o.id <> jt_records.id AND "
            "(o.latency_p50_us < jt_records.latency_p50_us OR "
            "(o.latency_p50_us = jt_records.latency_p50_us AND o.id < jt_records.id)))"
        )
    )


def upgrade() -> None:
    measured = "'gpu', 'eager', 'interp'"
    _keep_fastest(measured, measured)
    op.execute(sa.text(f"UPDATE jt_records SET timing = 'interp' WHERE {_ON_CPU} AND timing IN ('gpu', 'eager')"))


def downgrade() -> None:
    # the older key holds gpu, eager and graph records: an interp record becomes gpu unless its key has one
    op.execute(
        sa.text(
            "DELETE FROM jt_records WHERE timing = 'interp' AND EXISTS (SELECT 1 FROM jt_records o "
            f"WHERE {_SAME_KEY} AND o.timing = 'gpu')"
        )
    )
    op.execute(sa.text("UPDATE jt_records SET timing = 'gpu' WHERE timing = 'interp'"))
