"""Fixtures for the tuner's tests: test families importable by every process, fast settings, a SQLite file."""

from __future__ import annotations

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
def subprocess_env() -> dict[str, str]:
    """Environment for `jointtune ...` subprocesses: test families importable, short heartbeats."""
    from jt_procs import subprocess_environment

    return subprocess_environment()
