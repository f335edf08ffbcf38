"""Several real processes open an empty database at once and publish the same and different keys."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from _db_workers import SHARED_KEYS, forked_child, shared_latency, write_records

from jointtune.db import NewRecord, RecordKey, Store, head_revision, open_store

WORKERS = 4
STEPS = 25


@pytest.mark.slow
def test_concurrent_first_use_and_writes(db_url: str) -> None:
    """4 spawned workers open the same empty database at the same moment (they all migrate it)
    and publish 25 shared-key and 25 own-key records each."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=write_records, args=(db_url, w, STEPS, barrier, results)) for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert outcomes == {w: "ok" for w in range(WORKERS)}, "\n".join(outcomes.values())
    assert all(proc.exitcode == 0 for proc in procs)

    with Store(db_url) as store:
        assert store.revision() == head_revision() and not store.migration.changed
        key = {"kernel": "ag_gemm", "kernel_version": "v1", "dtype": "bfloat16", "world_size": 2, "hardware_id": "hw"}
        # every different key written once, none lost
        assert store.count_records() == SHARED_KEYS + WORKERS * STEPS
        for w in range(WORKERS):
            for step in range(STEPS):
                rec = store.best(RecordKey(**key, shape={"M": step + 1, "N": w + 1, "K": 7}))
                assert rec is not None and rec.config == {"worker": w, "step": step}
        # each shared key holds its fastest write, with that write's own config
        for shared in range(SHARED_KEYS):
            writes = {
                shared_latency(w, s): {"worker": w, "step": s}
                for w in range(WORKERS)
                for s in range(STEPS)
                if s % SHARED_KEYS == shared
            }
            rec = store.best(RecordKey(**key, shape={"M": 1024 * (shared + 1), "N": 64, "K": 64}))
            assert rec is not None
            assert (rec.latency_p50_us, rec.config) == (min(writes), writes[min(writes)])


def _backend_pid(store: Store) -> int | None:
    if store.backend != "postgresql":
        return None
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def test_forked_child_opens_its_own_connections(db_url: str, make_record: Callable[..., NewRecord]) -> None:
    store = open_store(db_url)
    try:
        store.upsert_record(make_record())
        parent_pid = _backend_pid(store)
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=forked_child, args=(db_url, make_record(dtype="float16"), results))
        child.start()
        outcome, child_pid = results.get(timeout=60)
        child.join(timeout=30)
        assert outcome == "ok" and child.exitcode == 0
        # the parent's pooled connection survived and the child did not share it
        assert _backend_pid(store) == parent_pid
        assert parent_pid is None or child_pid != parent_pid
        assert store.count_records() == 2
    finally:
        store.close()
