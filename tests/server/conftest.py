"""Fixtures of the service tests: the live server over a SQLite file or a fresh PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jt_server import LiveServer, serve


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'service.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'service.db'}"


@pytest.fixture
def server(db_url: str) -> Iterator[LiveServer]:
    """The service on SQLite and on PostgreSQL (the key tests run on both)."""
    yield from serve(db_url)


@pytest.fixture
def sqlite_server(sqlite_url: str) -> Iterator[LiveServer]:
    """The service on a SQLite file only (tests whose backend doesn't matter)."""
    yield from serve(sqlite_url)
