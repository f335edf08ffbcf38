"""Code run in spawned worker processes by test_db_concurrency (importable by module name)."""

from __future__ import annotations

import traceback
from typing import Any

SHARED_KEYS = 5


def shared_latency(worker: int, step: int) -> float:
    """Distinct per write, so exactly one write is the best for each shared key."""
    return 1000.0 - ((worker * 37 + step * 11) % 97) - worker / 10


def write_records(url: str, worker: int, steps: int, barrier: Any, results: Any) -> None:
    """Open the store (first use of an empty database for all workers at once) and publish."""
    try:
        from jointtune.db import NewRecord, open_store

        barrier.wait(timeout=60)
        store = open_store(url)
        for step in range(steps):
            common = {
                "kernel": "ag_gemm",
                "kernel_version": "v1",
                "space_version": "s1",
                "dtype": "bfloat16",
                "world_size": 2,
                "hardware_id": "hw",
                "triton_version": "3.6",
                "trials": 1,
            }
            shared = step % SHARED_KEYS
            latency = shared_latency(worker, step)
            store.upsert_record(
                NewRecord(
                    **common,
                    shape={"M": 1024 * (shared + 1), "N": 64, "K": 64},
                    config={"worker": worker, "step": step},
                    latency_p50_us=latency,
                )
            )
            store.upsert_record(
                NewRecord(
                    **common,
                    shape={"M": step + 1, "N": worker + 1, "K": 7},
                    config={"worker": worker, "step": step},
                    latency_p50_us=10.0 + step,
                )
            )
        results.put((worker, "ok"))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def forked_child(url: str, record: Any, results: Any) -> None:
    """Use the store the parent opened before the fork; report the PostgreSQL backend pid used."""
    try:
        import sqlalchemy as sa

        from jointtune.db import open_store

        store = open_store(url)
        store.upsert_record(record)
        pid = None
        if store.backend == "postgresql":
            with store.engine.connect() as conn:
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        results.put(("ok", pid))
    except BaseException:
        results.put((traceback.format_exc(), None))
