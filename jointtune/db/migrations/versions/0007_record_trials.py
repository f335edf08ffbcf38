"""A record's `trials` is its study's count: records written before this revision are brought up to it.

Until this revision the tuner wrote a record's `trials` when the record's config was found, so a best
config found by the third of sixteen trials said 3 in REST, bundles and the dashboard while the sweep's
table and `db list` said 16. The tuner now keeps the count up to date as its study runs; this revision
does it once for what is stored: each record whose study is in this database gets the study's count
(`StudyState.trial_count`, the one rule, read from Optuna's tables), never a lower one. Records without
a study here (imported from bundles, published over REST) keep theirs. Nothing to undo on downgrade.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import json
from collections import defaultdict

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: the user attrs that decide what a trial counts as (`jointtune.autotune.tuner.studies.trial_kind`)
_ATTRS = ("fail_reason", "jt_cached")


def _counts(conn: sa.Connection, names: set[str]) -> dict[str, int]:
    """Study name -> its trial count, for the named studies in this database."""
    from optuna.trial import FrozenTrial, TrialState

    from jointtune.autotune.tuner.studies import StudyState

    studies = conn.execute(sa.text("SELECT study_id, study_name FROM studies")).all()
    wanted = {row.study_id: row.study_name for row in studies if row.study_name in names}
    if not wanted:
        return {}
    trials = conn.execute(
        sa.select(sa.column("trial_id"), sa.column("number"), sa.column("study_id"), sa.column("state"))
        .select_from(sa.table("trials"))
        .where(sa.column("study_id").in_(list(wanted)))
    ).all()
    attrs: dict[int, dict[str, object]] = defaultdict(dict)
    for row in conn.execute(
        sa.select(sa.column("trial_id"), sa.column("key"), sa.column("value_json"))
        .select_from(sa.table("trial_user_attributes"))
        .where(sa.column("key").in_(_ATTRS))
    ):
        attrs[row.trial_id][row.key] = json.loads(row.value_json)
    values = dict(
        conn.execute(
            sa.select(sa.column("trial_id"), sa.column("value"))
            .select_from(sa.table("trial_values"))
            .where(sa.column("objective") == 0)
        ).all()
    )
    by_study: dict[str, list[FrozenTrial]] = defaultdict(list)
    for row in trials:
        state = TrialState[row.state] if isinstance(row.state, str) else TrialState(row.state)
        user_attrs = attrs.get(row.trial_id, {})
        trial = FrozenTrial(
            row.number, state, values.get(row.trial_id), None, None, {}, {}, user_attrs, {}, {}, row.trial_id
        )
        by_study[wanted[row.study_id]].append(trial)
    return {name: StudyState.of(found).trial_count for name, found in by_study.items()}


def upgrade() -> None:
    conn = op.get_bind()
    if not sa.inspect(conn).has_table("studies"):  # a store without Optuna's tables: no study to count
        return
    records = conn.execute(sa.text("SELECT id, study_name, trials FROM jt_records WHERE study_name IS NOT NULL")).all()
    counts = _counts(conn, {row.study_name for row in records})
    for row in records:
        count = counts.get(row.study_name)
        if count is not None and count > row.trials:
            conn.execute(sa.text("UPDATE jt_records SET trials = :n WHERE id = :id"), {"n": count, "id": row.id})


def downgrade() -> None:
    pass  # the counts stay right under the older code too
