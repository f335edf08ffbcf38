"""Bring a database to the newest schema, safely when many tuning workers start at once.

Migrations run through Alembic's API with `script_location` inside this package, so an installed
wheel upgrades its own database and no alembic.ini is needed. Opening a store calls `upgrade`: on
an up-to-date database that is one read of `jt_alembic_version`; otherwise the first worker takes
a lock, migrates and commits while the others wait on the lock and then find nothing to do.
The lock is `pg_advisory_xact_lock` on PostgreSQL and SQLite's write lock (`BEGIN IMMEDIATE`,
waited for through the busy timeout); the migration runs inside that same transaction.

Example:
    >>> upgrade(make_engine(resolve_db_url()))                            # doctest: +SKIP
    MigrationResult(before=None, after='0003')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from jointtune.db._engine import WRITE_OPTION
from jointtune.db._models import VERSION_TABLE
from jointtune.errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: the newest revision in `migrations/versions`; a test checks it against Alembic's head. Kept as a
#: constant so opening an up-to-date store never imports Alembic (a training job pays for imports).
SCHEMA_HEAD = "0007"
#: arbitrary constant naming our advisory lock (ASCII "jointtun"); any process migrating takes it
PG_LOCK_KEY = int.from_bytes(b"jointtun", "big") & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class MigrationResult:
    """Revision before and after an upgrade (before is None for an empty database)."""

    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config for our migrations; `url` only matters when Alembic connects by itself."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@functools.lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this version of jointtune knows."""
    return SCHEMA_HEAD


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is at (None when our tables were never created)."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _check_known(revision: str | None, url: str) -> None:
    if revision is None or revision == SCHEMA_HEAD:
        return
    try:
        _scripts().get_revision(revision)
    except Exception:
        raise StoreError(
            f"database {url}: schema revision {revision!r} is newer than this jointtune knows "
            f"(head {head_revision()!r}); upgrade jointtune to use this database"
        ) from None


def upgrade(engine: sa.Engine, *, display_url: str | None = None) -> MigrationResult:
    """Migrate to head if needed, holding the migration lock; idempotent and safe to run concurrently.

    Driver errors propagate (the store wraps them with the URL); `display_url` only names the
    database in the error for an unknown, newer revision.
    """
    url = display_url or engine.url.render_as_string(hide_password=True)
    head = head_revision()
    with engine.connect() as conn:
        before = current_revision(conn)
        conn.rollback()
    _check_known(before, url)
    if before == head:
        return MigrationResult(before, head)
    from alembic import command  # imported before taking the lock: waiting workers sleep less

    with engine.connect() as conn:
        conn = conn.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
            before = current_revision(conn)  # another worker may have migrated while we waited
            _check_known(before, url)
            if before != head:
                config = alembic_config()
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
    return MigrationResult(before, head)
