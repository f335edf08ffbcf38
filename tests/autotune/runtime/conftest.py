"""Fixtures of the decorator's tests: no run-time setting leaks in from the environment, and a store file each."""

from __future__ import annotations

from pathlib import Path

import pytest

from jointtune.autotune.runtime import policies
from jointtune.autotune.runtime.lookup import reset_warnings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JOINTTUNE_* run-time setting from the caller's shell, and every warning not yet given."""
    for name in ("JOINTTUNE_MODE", "JOINTTUNE_SERVER", "JOINTTUNE_PRINT", "JOINTTUNE_TOKEN", policies.ENV_FALLBACK):
        monkeypatch.delenv(name, raising=False)
    reset_warnings()


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A local store file of the test's own."""
    return f"sqlite:///{tmp_path / 'local.db'}"
