"""Which database the store talks to: the default per-user SQLite file or any URL the user gives.

Resolution order: an explicit argument, then `JOINTTUNE_DB_URL`, then the embedded SQLite file at
`$XDG_DATA_HOME/jointtune/jointtune.db` (`~/.local/share/jointtune/jointtune.db` when
`XDG_DATA_HOME` is unset or relative, as the XDG spec says). Only the two backends we test are
accepted: SQLite (one node, many processes) and PostgreSQL through psycopg 3 (many nodes).
`postgresql://` and `postgres://` (what most hosting providers print) are mapped to psycopg so
users can paste the URL they have.

Example:
    >>> resolve_db_url("postgres://tuner:secret@db.local/jt")
    'postgresql+psycopg://tuner:secret@db.local/jt'
    >>> redact_url("postgresql+psycopg://tuner:secret@db.local/jt")
    'postgresql+psycopg://tuner:***@db.local/jt'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from jointtune.errors import DatabaseURLError

#: environment variable naming the database URL
ENV_DB_URL = "JOINTTUNE_DB_URL"

_SQLITE_DRIVERS = {"sqlite", "sqlite+pysqlite"}
_POSTGRES_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg"}
_ALLOWED = (
    "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE "
    "(postgresql:// and postgres:// are accepted too)"
)
_MEMORY_NAMES = {"", ":memory:"}
_USERINFO = re.compile(r"(://[^:/@]*:)[^@/]*@")


def default_sqlite_path() -> Path:
    """Per-user location of the embedded store (the directory is created by `resolve_db_url`)."""
    data_home = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if data_home and Path(data_home).is_absolute() else Path.home() / ".local/share"
    return base / "jointtune" / "jointtune.db"


def redact_url(url: str | URL) -> str:
    """The URL with its password replaced by `***`, safe for logs and error messages."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _USERINFO.sub(r"\1***@", url)


def backend_name(url: str) -> str:
    """'sqlite' or 'postgresql' for a URL that `resolve_db_url` accepted."""
    return make_url(url).get_backend_name()


def is_memory_sqlite(url: str) -> bool:
    """True for `sqlite://` and `sqlite:///:memory:`: one private database per process."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and (parsed.database or "") in _MEMORY_NAMES


def resolve_db_url(url: str | None = None) -> str:
    """The canonical URL the store opens: explicit argument, then `JOINTTUNE_DB_URL`, then the default.

    SQLite paths become absolute (so every process and the per-URL cache agree on the file) and
    PostgreSQL URLs get the psycopg driver. Raises DatabaseURLError for a URL that can't be
    parsed or names another backend; nothing is connected here.
    """
    if url is not None and not url.strip():  # an unset variable in a script: not a wish for the default
        raise DatabaseURLError(f"database URL: {url!r} is empty; give {_ALLOWED}, or leave it out for ${ENV_DB_URL}")
    raw = url if url is not None else os.environ.get(ENV_DB_URL)
    if raw is None or not raw.strip():
        path = default_sqlite_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)
    raw = raw.strip()
    source = "database URL" if url is not None else ENV_DB_URL
    try:
        parsed = make_url(raw)
    except (ArgumentError, ValueError):
        raise DatabaseURLError(f"{source}: {redact_url(raw)!r} is malformed; expected {_ALLOWED}") from None
    driver = parsed.drivername.lower()
    if driver in _SQLITE_DRIVERS:
        parsed = _absolute_sqlite(parsed.set(drivername="sqlite"))
    elif driver in _POSTGRES_DRIVERS:
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise DatabaseURLError(
            f"{source}: {redact_url(parsed)!r} uses the unsupported backend {parsed.drivername!r}; allowed: {_ALLOWED}"
        )
    return parsed.render_as_string(hide_password=False)


def _absolute_sqlite(parsed: URL) -> URL:
    database = parsed.database or ""
    if database in _MEMORY_NAMES or database.startswith("file:"):
        return parsed
    return parsed.set(database=str(Path(database).expanduser().absolute()))
