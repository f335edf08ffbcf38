"""The lookup path (`best`, `nearest`): answers equal a plain-Python ranking, on SQLite and PostgreSQL,
whatever the order of the query's dims; and lookups leave the shared connection pool as they found it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from jointtune.db import NewRecord, Record, Store

MakeRecord = Callable[..., NewRecord]
KEY = {"kernel": "ag_gemm", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}


def _reference(records: list[Record], shape: dict[str, int], version: str | None, limit: int) -> list[int]:
    """Ids of the `limit` closest records as `Store.nearest` defines it: log2 distance, p50, id."""

    def dist2(record: Record) -> float:
        return sum((math.log2(record.shape[k]) - math.log2(v)) ** 2 for k, v in shape.items())

    same = [r for r in records if set(r.shape) == set(shape) and version in (None, r.kernel_version)]
    return [r.id for r in sorted(same, key=lambda r: (dist2(r), r.latency_p50_us, r.id))][:limit]


def test_nearest_equals_a_python_ranking(store: Store, make_record: MakeRecord) -> None:
    rng = random.Random(5)
    stored: list[Record] = []
    for _ in range(120):
        dims = rng.choice([("M", "N", "K"), ("M", "N")])
        shape = {d: rng.randrange(16, 20000) for d in dims}  # no two distances tie by accident
        version = rng.choice(["v1", "v2"])
        record, _ = store.upsert_record(
            make_record(kernel_version=version, shape=shape, latency_p50_us=rng.uniform(10, 1000))
        )
        stored.append(record)
    store.upsert_record(make_record(shape={"M": 64, "N": 64, "K": 64}, dtype="float16"))  # another key
    for _ in range(40):
        dims = list(rng.choice([("M", "N", "K"), ("M", "N")]))
        rng.shuffle(dims)  # the query's order of dims must not matter
        picked = rng.choice(stored)
        if set(picked.shape) == set(dims) and rng.random() < 0.3:
            shape = {d: picked.shape[d] for d in dims}  # a stored shape: distance 0
        else:
            shape = {d: rng.randrange(16, 20000) for d in dims}
        for version in ("v1", None):
            for limit in (1, 4):
                found = store.nearest(**KEY, kernel_version=version, shape=shape, limit=limit)
                assert [r.id for r, _ in found] == _reference(stored, shape, version, limit)
                for record, distance in found:
                    assert record == store.get_record(record.id)  # the full row, not a partial one
                    want = math.sqrt(sum((math.log2(record.shape[k]) - math.log2(v)) ** 2 for k, v in shape.items()))
                    assert distance == pytest.approx(want, rel=1e-9, abs=1e-12)
                    assert (distance == 0.0) == (record.shape == shape)
        best = store.best(**KEY, kernel_version="v1", shape=shape)
        exact = [r for r in stored if r.shape == shape and r.kernel_version == "v1"]
        assert best == (exact[0] if exact else None)


def test_lookups_leave_pooled_connections_transactional(pg_url: str, make_record: MakeRecord) -> None:
    """PostgreSQL lookups run in autocommit on the pool that writes share: a connection handed back
    must be transactional again, or a later write's statements would each commit on their own."""
    with Store(pg_url) as store:
        record, _ = store.upsert_record(make_record())
        assert store.best(**KEY, kernel_version="v1", shape=record.shape) == record
        assert store.nearest(**KEY, kernel_version=None, shape={**record.shape, "M": 5}, limit=2)[0][0] == record
        assert store.engine.pool.checkedin() == 1  # the one connection, used by the lookups, is back
        with store.engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False
