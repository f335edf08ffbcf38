"""Revision 0003 on a store poisoned before it: unservable records go to jt_quarantine, the rest stays."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from jointtune.db import RecordKey, Store, head_revision
from jointtune.db._engine import make_engine
from jointtune.db._migrate import alembic_config
from jointtune.db._models import Base

_NOW = datetime(2026, 11, 22, tzinfo=timezone.utc)
KEY = {"kernel": "ag_gemm", "kernel_version": "v1", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}


def _deep(levels: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


def _row(m: int, **overrides: Any) -> dict[str, Any]:
    shape = overrides.pop("shape", {"K": 64, "M": m, "N": 64})
    row = dict(kernel="ag_gemm", kernel_version="v1", space_version="s", shape=shape,
               shape_key=",".join(f"{k}={shape[k]}" for k in sorted(shape)), dims_signature=",".join(sorted(shape)),
               dtype="bfloat16", world_size=2, hardware_id="h200x2-nvl", triton_version="3.6", config={"mode": "ce"},
               config_hash="x", latency_p50_us=500.0, trials=4, tuner_version="0", created_at=_NOW,
               updated_at=_NOW)  # fmt: skip
    row.update(overrides)
    return row


def _store_at_0002(db_url: str, rows: list[dict[str, Any]], fingerprint: str = "{}") -> dict[int, int]:
    """A database at revision 0002 holding `rows` as the old store let them in; returns m -> id."""
    from alembic import command

    engine = make_engine(db_url)
    ids = {}
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0002")
        kernels = {(r["kernel"], r["kernel_version"]) for r in rows}
        for name, version in sorted(kernels):
            conn.execute(sa.text("INSERT INTO jt_kernels (name, version, created_at) VALUES (:n, :v, :t)"),
                         {"n": name, "v": version, "t": _NOW})  # fmt: skip
        insert = "INSERT INTO jt_hardware_profiles (hardware_id, name, fingerprint, created_at) "
        insert += " VALUES (:h, 'GPU', :f, :t)"
        for hardware_id in sorted({r["hardware_id"] for r in rows}):
            conn.execute(sa.text(insert), {"h": hardware_id, "f": fingerprint, "t": _NOW})
        records = Base.metadata.tables["jt_records"]
        for row in rows:
            ids[row["shape"]["M"]] = conn.execute(sa.insert(records).values(**row).returning(records.c.id)).scalar_one()
    engine.dispose()
    return ids


def test_unservable_records_are_quarantined_and_the_rest_served(db_url: str) -> None:
    poison = {
        2: _row(2, config=_deep(300)),  # saved, then every read of it failed (issue 17, item 1)
        3: _row(3, shape={"K": 64, "M": 3, "N": 10**309}),  # PostgreSQL: its group's nearest lookups failed
        4: _row(4, kernel="a/b"),  # no GET could reach it
        5: _row(5, world_size=0),
    }
    if db_url.startswith("sqlite"):  # PostgreSQL's JSONB never took these
        poison[6] = _row(6, config={"mode": "\ud800"})
        poison[7] = _row(7, config={"x": float("inf")})
    good = {1: _row(1), 8: _row(8, dtype="bf16"), 9: _row(9, dtype="fp16", latency_p50_us=400.0),
            10: _row(10, dtype="fp16", latency_p50_us=900.0)}  # fmt: skip
    clash = _row(9, dtype="float16", latency_p50_us=450.0)  # same key as 9 under torch's name: 9 is faster
    clash["shape"] = dict(clash["shape"], M=9)
    faster = _row(10, dtype="float16", latency_p50_us=800.0)  # same key as 10, faster than it
    rows = [*good.values(), *poison.values()]
    ids = _store_at_0002(db_url, rows, fingerprint=json.dumps({"gpu": "x"}))
    with make_engine(db_url).begin() as conn:  # the clashing pair, under the torch name
        records = Base.metadata.tables["jt_records"]
        clash_id = conn.execute(sa.insert(records).values(**clash).returning(records.c.id)).scalar_one()
        faster_id = conn.execute(sa.insert(records).values(**faster).returning(records.c.id)).scalar_one()

    with Store(db_url) as store:
        assert store.migration is not None and store.migration.before == "0002"
        assert store.revision() == head_revision()
        kept = {r.id: r for r in store.list_records()}
        assert set(kept) == {ids[1], ids[8], ids[9], faster_id}
        assert kept[ids[8]].dtype == "bfloat16" and kept[ids[9]].dtype == "float16"
        assert store.best(RecordKey(**KEY, shape={"K": 64, "M": 8, "N": 64})).id == ids[8]  # reachable as bfloat16 now
        with store.engine.connect() as conn:
            quarantined = conn.execute(sa.text("SELECT source_table, source_id, reason, data FROM jt_quarantine")).all()
        moved = {row.source_id: row for row in quarantined if row.source_table == "jt_records"}
        assert set(moved) == {*(ids[m] for m in poison), clash_id, ids[10]}
        assert "config" in moved[ids[2]].reason and "kernel" in moved[ids[4]].reason
        assert json.loads(moved[ids[4]].data)["kernel"] == "a/b"  # the row as it was, nothing lost
        # every read that used to fail on them works: lists, pages, exports, nearest lookups of the group
        assert store.count_records() == 4
        assert store.nearest(RecordKey(**KEY, shape={"K": 64, "M": 3, "N": 64}), limit=5)
        assert len(store.export_json(hardware_id="h200x2-nvl", limit=100)) == 4
