"""Alembic environment for the tuning store, run by `jointtune.db._migrate` (no alembic.ini needed).

The store passes an open connection in `config.attributes["connection"]`, already inside a
transaction that holds the migration lock, so this file neither connects nor commits. Without one
(e.g. `alembic revision --autogenerate` run by a developer through `_migrate.alembic_config(url)`)
it connects to `sqlalchemy.url` itself. Offline mode (`--sql`) renders the SQL for a DBA.

Our version table is `jt_alembic_version` and only `jt_` tables are compared, because Optuna's
tables and its own `alembic_version` live in the same database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from jointtune.db._models import VERSION_TABLE, Base


def _ours(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    return type_ != "table" or (name or "").startswith("jt_")


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=_ours,
        render_as_batch=True,  # SQLite can only ALTER through table copies
        compare_type=True,
        **kwargs,
    )


def _run() -> None:
    config = context.config
    if context.is_offline_mode():
        _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as own:
        _configure(connection=own)
        with context.begin_transaction():
            context.run_migrations()


_run()
