"""Fixtures for the tuner's tests: test families importable by every process, fast settings, a SQLite file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Spawned ranks inherit sys.path; torchrun and CLI subprocesses read PYTHONPATH.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def families():
    """The test families module (registers jt_sleep, jt_faulty, jt_broken and jt_matmul)."""
    import jt_families

    return jt_families


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jt.db'}"


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `jointtune ...` subprocesses: test families importable, short heartbeats."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["JOINTTUNE_HEARTBEAT_S"] = "1"
    env["JOINTTUNE_GRACE_S"] = "3"
    env["COLUMNS"] = "200"
    env.pop("JOINTTUNE_DB_URL", None)
    return env
