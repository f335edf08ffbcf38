"""Engines tuned for many tuning workers sharing one database, and one way to report driver errors.

SQLite: WAL (readers never block the writer), a 30 s busy timeout (workers wait for the write
lock instead of failing), foreign keys on, and transactions we begin ourselves: pysqlite's own
transaction handling begins lazily, so a transaction that reads before it writes can hit
"database is locked" without waiting. Write transactions use `BEGIN IMMEDIATE` (take the write
lock first, so the busy timeout applies); reads use a plain `BEGIN`.
PostgreSQL: a 5 s connect timeout so an unreachable server fails fast, and pre-ping so pooled
connections survive server restarts.
"""

from __future__ import annotations

import importlib.util
import math
import sqlite3
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import StaticPool

from jointtune.db._url import backend_name, is_memory_sqlite, redact_url
from jointtune.errors import StoreError

#: how long SQLite waits for another process's write lock before giving up
SQLITE_BUSY_TIMEOUT_S = 30.0
#: how long PostgreSQL connection attempts may take
CONNECT_TIMEOUT_S = 5
#: execution option that makes a SQLite transaction start with BEGIN IMMEDIATE
WRITE_OPTION = "jointtune_write"
#: SQLite 3.35 brought RETURNING; 3.24 brought ON CONFLICT DO UPDATE
MIN_SQLITE = (3, 35, 0)


def make_engine(url: str) -> sa.Engine:
    """An engine for a URL resolved by `resolve_db_url`; connects lazily."""
    if backend_name(url) == "sqlite":
        return _sqlite_engine(url)
    if importlib.util.find_spec("psycopg") is None:
        raise StoreError(
            f"database {redact_url(url)}: PostgreSQL needs the psycopg driver; "
            "install it with: pip install 'jointtune[postgres]'"
        )
    return sa.create_engine(
        url,
        pool_pre_ping=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "jointtune"},
    )


def _log2(value: float | None) -> float | None:
    return math.log2(value) if value is not None and value > 0 else None


def _sqlite_engine(url: str) -> sa.Engine:
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            f"database {url}: SQLite {sqlite3.sqlite_version} is too old; "
            f"jointtune needs >= {'.'.join(map(str, MIN_SQLITE))} (RETURNING and upserts)"
        )
    memory = is_memory_sqlite(url)
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
    }
    if memory:  # one connection, or every checkout would see its own empty database
        kwargs["poolclass"] = StaticPool
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, see _on_begin
        # log2() for the nearest-shape distance (SQLite's own math functions are a build option)
        dbapi_conn.create_function("log2", 1, _log2, deterministic=True)
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if not memory:
                _set_wal(cursor)
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _set_wal(cursor: sqlite3.Cursor) -> None:
    # Switching a fresh file to WAL needs a short exclusive lock, which SQLite does not wait for
    # through the busy handler; workers starting together retry briefly. Once set, WAL persists
    # in the file and this is a no-op.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def store_error(url: str, action: str, exc: BaseException) -> StoreError:
    """A StoreError naming the database (password hidden), what we tried and the driver's cause."""
    return StoreError(f"database {redact_url(url)}: {action} failed: {describe_cause(exc)}")


def describe_cause(exc: BaseException) -> str:
    """The driver's message on one line, without SQLAlchemy's statement dump and doc links."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip() or type(orig).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("[SQL:", "[parameters:", "(Background on"))]
    # psycopg prefixes every connect error with this; our message already says what failed
    if lines and lines[0].startswith("connection failed: "):
        lines[0] = lines[0].removeprefix("connection failed: ")
    return "; ".join(lines) or type(orig).__name__


def is_retryable(exc: BaseException) -> bool:
    """PostgreSQL deadlocks and serialization failures: safe to run the transaction again."""
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return code in {"40001", "40P01"}
