"""The lookup's fast query plan answers exactly what `Store.nearest` answers (ties and versions included)."""

from __future__ import annotations

import math

import pytest

from jointtune.db import NewRecord, Store
from jointtune.server.routes._find import find

KEY = {"kernel": "ag_gemm", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}


def _record(version: str, m: int, p50: float, n: int = 4096) -> NewRecord:
    return NewRecord(
        kernel_version=version,
        space_version="s1",
        shape={"M": m, "N": n, "K": 4096},
        triton_version="3.6",
        config={"BLOCK_M": m // 8},
        latency_p50_us=p50,
        trials=8,
        **KEY,
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_find_agrees_with_store_nearest(backend: str, request: pytest.FixtureRequest, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'plan.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    with Store(url) as store:
        # 2048 is a tie between 1024 and 4096 (distance 1 each): the lower p50 (4096's) must win
        for version, m, p50 in [("v1", 1024, 90.0), ("v1", 4096, 80.0), ("v1", 8192, 300.0), ("v2", 1000, 50.0)]:
            store.upsert_record(_record(version, m, p50))
        store.upsert_record(_record("v1", 4096, 70.0, n=8192))
        for version in (None, "v1", "v2", "v9"):
            for m in (1000, 1024, 2048, 3000, 4096, 6000, 8192, 65536):
                shape = {"M": m, "N": 4096, "K": 4096}
                expected = store.nearest(kernel_version=version, shape=shape, limit=1, **KEY)
                got = find(store, kernel_version=version, shape=shape, **KEY)
                if not expected:
                    assert got is None, (version, m)
                    continue
                assert got is not None and got[0].id == expected[0][0].id, (version, m)
                assert math.isclose(got[1], expected[0][1], abs_tol=1e-6), (version, m)
                assert (got[1] == 0) == (expected[0][1] == 0), (version, m)
        assert find(store, kernel_version=None, shape={"B": 4, "S": 128}, **KEY) is None
