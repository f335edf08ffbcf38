"""The tuning store: best configs per (kernel, kernel version, shape, dtype, world size, hardware).

SQLAlchemy 2 models and Alembic migrations (shipped in `migrations/`, applied on first use) over
an embedded SQLite file by default or any PostgreSQL URL. Trial history is not here: it lives in
Optuna's RDB storage on the same database URL (see `_models` for why).

A record's format is defined once, by `schema.RecordIn`; `jointtune.db.record` builds the store's values
(`NewRecord`, `Record`), the key that names a record (`RecordKey`: what every lookup, filter and tuning key
carries) and the lookup's answer (`LookupOut`) from it.

Example:
    >>> from jointtune.db import NewRecord, open_store                    # doctest: +SKIP
    >>> store = open_store()            # $JOINTTUNE_DB_URL or ~/.local/share/jointtune/jointtune.db  # doctest: +SKIP
    >>> record, stored = store.upsert_record(NewRecord(...))              # doctest: +SKIP
    >>> key = RecordKey(kernel="ag_gemm", kernel_version=v, shape={"M": 8192, "N": 4096, "K": 12288},  # doctest: +SKIP
    ...                 dtype="bfloat16", world_size=2, hardware_id=hw)
    >>> store.best(key)                                                    # doctest: +SKIP
"""

from __future__ import annotations

from jointtune.canonical import config_hash, shape_key
from jointtune.db import schema
from jointtune.db._migrate import MigrationResult, head_revision
from jointtune.db._store import Store, open_store
from jointtune.db._url import ENV_DB_URL, default_sqlite_path, is_memory_sqlite, redact_url, resolve_db_url
from jointtune.db._values import HardwareProfile, InvalidRecordError, KernelInfo
from jointtune.db.key import RecordKey
from jointtune.db.record import KEY_FIELDS, PUBLISHED, STORE_SET, LookupOut, NewRecord, Record
from jointtune.db.schema import HardwareIn, RecordIn

__all__ = [
    "ENV_DB_URL",
    "KEY_FIELDS",
    "PUBLISHED",
    "STORE_SET",
    "HardwareIn",
    "HardwareProfile",
    "InvalidRecordError",
    "KernelInfo",
    "LookupOut",
    "MigrationResult",
    "NewRecord",
    "Record",
    "RecordIn",
    "RecordKey",
    "Store",
    "config_hash",
    "default_sqlite_path",
    "head_revision",
    "is_memory_sqlite",
    "open_store",
    "redact_url",
    "resolve_db_url",
    "schema",
    "shape_key",
]
