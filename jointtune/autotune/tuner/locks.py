"""A lock per study across processes and nodes, so budget checks and claims don't race.

Two groups that both see "one trial left" would otherwise both ask Optuna for it and overshoot the
budget. Claims are short (count, ask, validate), so one lock per study costs nothing. PostgreSQL
gives session advisory locks (no table, no schema change); SQLite is single-host, so a file lock
beside the database file does; an in-memory SQLite database belongs to one process, where a
thread lock is enough.

Example:
    >>> with study_lock("sqlite:////tmp/jt.db", "jointtune:ag_gemm@..."):     # doctest: +SKIP
    ...     claim_next_trial()
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

_thread_locks: dict[str, threading.Lock] = {}
_engines: dict[str, Any] = {}
_guard = threading.Lock()


def _lock_id(name: str) -> int:
    """A signed 64-bit id for pg_advisory_lock, stable across processes."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _thread_lock(key: str) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault(key, threading.Lock())


def _pg_engine(url: str) -> Any:
    import sqlalchemy as sa

    with _guard:
        engine = _engines.get(url)
        if engine is None:
            engine = sa.create_engine(url, pool_size=1, max_overflow=2, pool_pre_ping=True)
            _engines[url] = engine
        return engine


@contextlib.contextmanager
def study_lock(url: str, name: str) -> Iterator[None]:
    """Hold the lock of study `name` on database `url` (threads of one process queue first)."""
    parsed = make_url(url)
    with _thread_lock(f"{url}\0{name}"):
        if parsed.get_backend_name() == "postgresql":
            import sqlalchemy as sa

            with _pg_engine(url).connect() as conn:
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _lock_id(name)})
                try:
                    yield
                finally:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _lock_id(name)})
                    conn.commit()
            return
        database = parsed.database or ""
        if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
            yield
            return
        path = Path(f"{database}.jt-locks") / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
