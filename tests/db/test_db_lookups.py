"""The lookup path (`best`, `nearest`): answers equal a plain-Python ranking, on SQLite and PostgreSQL,
whatever the order of the query's dims; and lookups leave the shared connection pool as they found it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from jointtune.db import NewRecord, Record, RecordKey, Store

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
                found = store.nearest(RecordKey(**KEY, kernel_version=version, shape=shape), limit=limit)
                assert [r.id for r, _ in found] == _reference(stored, shape, version, limit)
                for record, distance in found:
                    assert record == store.get_record(record.id)  # the full row, not a partial one
                    want = math.sqrt(sum((math.log2(record.shape[k]) - math.log2(v)) ** 2 for k, v in shape.items()))
                    assert distance == pytest.approx(want, rel=1e-9, abs=1e-12)
                    assert (distance == 0.0) == (record.shape == shape)
        best = store.best(RecordKey(**KEY, kernel_version="v1", shape=shape))
        exact = [r for r in stored if r.shape == shape and r.kernel_version == "v1"]
        assert best == (exact[0] if exact else None)


def test_lookups_leave_pooled_connections_transactional(pg_url: str, make_record: MakeRecord) -> None:
    """PostgreSQL lookups run in autocommit on the pool that writes share: a connection handed back
    must be transactional again, or a later write's statements would each commit on their own."""
    with Store(pg_url) as store:
        record, _ = store.upsert_record(make_record())
        assert store.best(RecordKey(**KEY, kernel_version="v1", shape=record.shape)) == record
        near = store.nearest(RecordKey(**KEY, kernel_version=None, shape={**record.shape, "M": 5}), limit=2)
        assert near[0][0] == record
        assert store.engine.pool.checkedin() == 1  # the one connection, used by the lookups, is back
        with store.engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False


def test_what_a_miss_reads_equals_the_records(store: Store, make_record: MakeRecord) -> None:
    """`key_values`, `hardware_ids` and `kernel_names` (a miss's explanation, unknown-id messages) answer what the
    records hold, ordered and cut to `limit`, from the index rather than the records."""
    for hw, dtype, world, timing, version, shape in [
        ("h200x2-nvl", "bfloat16", 2, "gpu", "v1", {"M": 8, "N": 8, "K": 8}),
        ("h200x2-nvl", "bfloat16", 2, "eager", "v2", {"M": 8, "N": 8}),
        ("h200x2-nvl", "float16", 4, "gpu", "v1", {"M": 8, "N": 8, "K": 8}),
        ("a100x8", "bfloat16", 2, "gpu", "v1", {"M": 8, "N": 8, "K": 8}),
    ]:
        store.upsert_record(make_record(hardware_id=hw, dtype=dtype, world_size=world, timing=timing,
                                        kernel_version=version, shape=shape))  # fmt: skip
    store.upsert_record(make_record(kernel="gemm_rs", hardware_id="mi300x8"))
    store.upsert_hardware(hardware_id="b200x8", name="no records", fingerprint={})
    on_hw = RecordKey.any(kernel="ag_gemm", hardware_id="h200x2-nvl")
    assert store.key_values(("dtype", "world_size"), on_hw) == [("bfloat16", 2), ("float16", 4)]
    on_hw2 = on_hw.replace(dtype="bf16", world_size=2)
    assert store.key_values(("timing", "kernel_version", "dims_signature"), on_hw2) == [
        ("eager", "v2", "M,N"), ("gpu", "v1", "K,M,N"),
    ]  # fmt: skip
    assert store.key_values(("dtype",), on_hw, limit=1) == [("bfloat16",)]
    assert store.key_values(("dtype",), RecordKey.any(kernel="nope")) == []
    with pytest.raises(ValueError, match="config"):
        store.key_values(("config",), RecordKey.any(kernel="ag_gemm"))
    assert store.hardware_ids(kernel="ag_gemm") == (["a100x8", "h200x2-nvl"], 2)
    assert store.hardware_ids(kernel="ag_gemm", limit=1) == (["a100x8"], 2)
    assert store.hardware_ids() == (["a100x8", "b200x8", "h200x2-nvl", "mi300x8"], 4)  # every profile
    assert store.kernel_names() == (["ag_gemm", "gemm_rs"], 2)
    assert store.kernel_names(limit=1) == (["ag_gemm"], 2)
