"""Shared fixtures: the CPU interpreter for kernels, and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

# Kernels run in Triton's interpreter when there is no GPU; it must be chosen before triton.jit runs.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # One thread a process unless the caller chose: the interpreter's small tensors gain nothing from more, and two
        # xdist workers (and the ranks and CLIs the tests start, which inherit it) contend on two cores otherwise: the
        # kernel tests ran 4-8% faster so (2026-11-27).
        if "OMP_NUM_THREADS" not in os.environ:
            os.environ["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass


@pytest.fixture(autouse=True, scope="session")
def _private_default_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The default store (and $JOINTTUNE_DB_URL) of the person running the tests stays out of them:
    `make sweep` then `make test` must not see the sweep's records, nor a test write into them.
    Set in os.environ, so every subprocess a test starts inherits it."""
    saved = {name: os.environ.get(name) for name in ("XDG_DATA_HOME", "JOINTTUNE_DB_URL")}
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))
    os.environ.pop("JOINTTUNE_DB_URL", None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


PG_ADMIN_URL = os.environ.get("JOINTTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin_engine():
    import sqlalchemy as sa

    return sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


@pytest.fixture(scope="session")
def pg_available() -> bool:
    try:
        import sqlalchemy as sa

        with _pg_admin_engine().connect() as conn:
            conn.execute(sa.text("select 1"))
        return True
    except Exception as exc:
        if os.environ.get("JOINTTUNE_REQUIRE_PG"):
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required (JOINTTUNE_REQUIRE_PG) but unreachable: {exc}")
        return False


@pytest.fixture
def pg_url(pg_available: bool) -> Iterator[str]:
    """URL of a brand-new, empty PostgreSQL database, dropped after the test."""
    if not pg_available:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    import sqlalchemy as sa

    name = f"jt_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
