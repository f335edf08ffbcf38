"""The tensor-parallel tests' fixtures (their helpers live in jt_tp.py)."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet_lookups():
    """An empty store: every op warns once that it runs its space default; the tests know."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*no tuned shape near.*")
        yield
