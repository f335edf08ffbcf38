"""Fixtures for the store's tests: every contract test runs on a SQLite file and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jointtune.db import NewRecord, Store


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A URL of an empty database: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated store, closed before its database is dropped."""
    with Store(db_url) as opened:
        yield opened


def _record(**overrides: Any) -> NewRecord:
    fields: dict[str, Any] = {
        "kernel": "ag_gemm",
        "kernel_version": "v1",
        "space_version": "s1",
        "shape": {"M": 8192, "N": 4096, "K": 12288},
        "dtype": "bfloat16",
        "world_size": 2,
        "hardware_id": "h200x2-nvl",
        "triton_version": "3.6",
        "config": {"BLOCK_M": 128, "BLOCK_N": 128, "mode": "pull"},
        "latency_p10_us": 590.0,
        "latency_p50_us": 600.0,
        "latency_p90_us": 620.0,
        "baseline_us": 940.0,
        "trials": 64,
        "study_name": "ag_gemm-8192",
    }
    fields.update(overrides)
    if "latency_p50_us" in overrides and not {"latency_p10_us", "latency_p90_us"} & set(overrides):
        fields["latency_p10_us"] = fields["latency_p90_us"] = None
    return NewRecord(**fields)


@pytest.fixture
def make_record() -> Callable[..., NewRecord]:
    """Build a valid NewRecord, overriding any field by keyword."""
    return _record
