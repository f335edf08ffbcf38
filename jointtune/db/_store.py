"""`Store`: the tuning store's one entry point; sessions and transactions never leave it.

Publishing keeps the better record: a new record replaces the stored one for its key only when
its `latency_p50_us` is strictly lower; ties keep the existing record. Trials are not added up: a
record's `trials` is the count of its study (`StudyState.trial_count`), which the tuner raises as
the study goes on (`note_trials`), so every view of the record (`db list`, REST, bundles, the
dashboard) shows the number the sweep's table shows. Summing would make a retried publish (the same
record sent twice, e.g. after a client timeout) count twice and break idempotency; the full history
stays in the Optuna study named by `study_name`.

Longer than our usual module because it is the store's whole public surface, one short method
per operation; the SQL lives in `_queries`, argument checks in `_checks`, migrations in `_migrate`.

Example:
    >>> store = open_store("sqlite:///tuning.db")                         # doctest: +SKIP
    >>> record, stored = store.upsert_record(new_record)                  # doctest: +SKIP
    >>> store.nearest(RecordKey(kernel="ag_gemm", kernel_version=None, shape={"M": 4096, "N": 4096, "K": 8192},
    ...                         dtype="bfloat16", world_size=2, hardware_id=hw))    # doctest: +SKIP
    [(Record(id=1, ...), 1.0)]
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from jointtune.canonical import shape_key
from jointtune.db import _queries as q
from jointtune.db._checks import check_hardware, check_kernel, check_page, check_timing, in_id_range
from jointtune.db._engine import (
    CONNECT_TIMEOUT_S,
    SQLITE_BUSY_TIMEOUT_S,
    WRITE_OPTION,
    is_retryable,
    make_engine,
    store_error,
)
from jointtune.db._migrate import MigrationResult, current_revision, head_revision, upgrade
from jointtune.db._models import LIST_ORDER, RECORD_KEY, HardwareRow, KernelRow, RecordRow
from jointtune.db._url import backend_name, is_memory_sqlite, redact_url, resolve_db_url
from jointtune.db._values import HardwareProfile, KernelInfo
from jointtune.db.key import RecordKey
from jointtune.db.record import NewRecord, Record
from jointtune.errors import StoreError

T = TypeVar("T")
_RETRIES = 5
#: rows per INSERT of an import (22 columns each: well under SQLite's 32766 parameters)
_IMPORT_BATCH = 400
#: rows an export formats between two offers of the GIL to other threads (~1 ms of work)
_YIELD_EVERY = 100


class Store(contextlib.AbstractContextManager):
    """Best configs per (kernel, kernel_version, shape, dtype, world_size, hardware) in one database.

    Opening migrates an empty or outdated database (pass `migrate=False` to only inspect it).
    Methods take keyword arguments and return frozen dataclasses; errors are StoreError (driver
    problems, naming the URL with the password hidden) or InvalidRecordError (bad arguments).
    """

    def __init__(self, url: str | None = None, *, migrate: bool = True) -> None:
        self.url = resolve_db_url(url)
        self.display_url = redact_url(self.url)
        self.backend = backend_name(self.url)
        if self.backend == "sqlite" and not is_memory_sqlite(self.url):
            folder = Path(sa.make_url(self.url).database or "").parent
            if not folder.is_dir():
                raise StoreError(f"database {self.display_url}: directory {folder} does not exist; create it first")
        self.engine = make_engine(self.url)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self.engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False)
        # lookups (`_lookup`): the same pool; on PostgreSQL without BEGIN/COMMIT around single statements
        postgres = self.backend == "postgresql"
        self._reader = self.engine.execution_options(isolation_level="AUTOCOMMIT") if postgres else self.engine
        try:
            with self.engine.connect():
                pass
        except sa.exc.SQLAlchemyError as exc:
            self.engine.dispose()
            raise store_error(self.url, "connecting", exc) from exc
        try:
            self.migration: MigrationResult | None = self.upgrade() if migrate else None
        except StoreError:
            self.engine.dispose()
            raise

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

    def __exit__(self, *exc: object) -> None:  # `with Store(url) as store:` closes it at the end
        self.close()

    def close(self) -> None:
        """Release the connections and forget this store in `open_store`'s cache."""
        with _CACHE_LOCK:
            if _CACHE.get(self.url) is self:
                del _CACHE[self.url]
        self.engine.dispose()

    # -- schema ---------------------------------------------------------------------------------

    def upgrade(self) -> MigrationResult:
        """Migrate to the newest schema (idempotent; concurrent callers wait on a lock)."""
        try:
            return upgrade(self.engine, display_url=self.display_url)
        except sa.exc.SQLAlchemyError as exc:
            raise store_error(self.url, "migrating the schema", exc) from exc
        except Exception as exc:
            from alembic.util import CommandError  # imported only here: opening stays Alembic-free

            if isinstance(exc, CommandError):
                raise store_error(self.url, "migrating the schema", exc) from exc
            raise

    def revision(self) -> str | None:
        """The schema revision the database is at (None before the first migration)."""
        return self._run("reading the schema revision", _revision_in, write=False)

    @staticmethod
    def head_revision() -> str:
        return head_revision()

    def optuna_engine_kwargs(self) -> dict[str, Any]:
        """`engine_kwargs` for Optuna's RDBStorage on this URL: the same wait and timeout rules."""
        if self.backend == "sqlite":
            return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}

    # -- records --------------------------------------------------------------------------------

    def upsert_record(self, record: NewRecord, *, supersede: bool = False) -> tuple[Record, bool]:
        """Store `record` unless the stored one for its key is as fast or faster (with `supersede`, also when the
        stored one came from the same study: the study's final round re-judged its pick).

        Returns the record now stored for the key and whether it is the new one.
        """
        record = record.validate()
        dialect = self.backend

        def run(session: Session) -> tuple[Record, bool]:
            session.execute(q.ensure_kernel(dialect, record.kernel, record.kernel_version))
            session.execute(q.ensure_hardware(dialect, record.hardware_id))
            stored_id = session.execute(q.upsert_record(dialect, record, supersede=supersede)).scalar_one_or_none()
            params = q.key_params(RecordKey.of(record))
            return q.to_record(session.execute(q.EXACT, params).one()), stored_id is not None

        return self._run("publishing a record", run, write=True)

    def note_trials(self, key: RecordKey, *, study_name: str, trials: int) -> bool:
        """Raise the trial count of the key's record to `trials` if study `study_name` made it (a record
        kept from another study keeps its own count). Returns whether a record changed."""
        params = q.key_params(key.checked())
        params = {f"k_{name}": value for name, value in params.items()}
        params.update(k_study_name=study_name, new_trials=int(trials))
        return self._run("counting trials", lambda s: s.execute(q.RAISE_TRIALS, params).rowcount > 0, write=True)

    def import_records(
        self, records: Sequence[NewRecord], *, hardware: Sequence[dict[str, Any]] = ()
    ) -> tuple[int, int]:
        """Publish many records (and hardware profiles) in ONE transaction: all of them or none.

        Every record and profile is validated before anything is written. Per key, the fastest of
        the given records competes with the stored one, as `upsert_record` decides. A profile
        ({hardware_id, name, fingerprint}) replaces the stored one when its fingerprint is not empty,
        and is only created otherwise (an empty fingerprint never blanks a known one). Returns
        (records given, records stored).
        """
        checked = [record.validate() for record in records]
        profiles = [check_hardware(**profile) for profile in hardware]
        best: dict[tuple[Any, ...], NewRecord] = {}
        for record in checked:  # one row per key: a statement may update a row only once
            key = tuple(getattr(record, column) for column in RECORD_KEY)
            if key not in best or record.latency_p50_us < best[key].latency_p50_us:
                best[key] = record
        dialect = self.backend

        def run(session: Session) -> int:
            for profile in profiles:
                if profile.fingerprint:
                    session.execute(q.upsert_hardware(dialect, profile.hardware_id, profile.name, profile.fingerprint))
                else:
                    session.execute(q.ensure_hardware(dialect, profile.hardware_id, profile.name))
            rows = list(best.values())
            if not rows:
                return 0
            session.execute(q.ensure_kernels(dialect, sorted({(r.kernel, r.kernel_version) for r in rows})))
            for hardware_id in sorted({r.hardware_id for r in rows}):
                session.execute(q.ensure_hardware(dialect, hardware_id))
            stamp, changed = q.now(), 0
            for first in range(0, len(rows), _IMPORT_BATCH):
                values = [q.record_values(r, stamp) for r in rows[first : first + _IMPORT_BATCH]]
                changed += len(session.execute(q.upsert_records(dialect, values)).all())
            return changed

        return len(records), self._run("importing records", run, write=True)

    def export_json(
        self, *, hardware_id: str, kernel: str | None = None, after: int = 0, limit: int = 500
    ) -> list[tuple[int, str]]:
        """(id, JSON text of its NewRecord fields) of the records of one hardware (optionally one
        kernel) with id > `after`, by id. Keyset pages stay correct while records are published (a
        replaced record keeps its id) and cost the same at the end of a large store as at its start.

        JSON text, not Records: an export page is the one read that grows with the store, and
        splicing the database's own JSON of `shape` and `config` costs a fifth of loading them into
        Python objects and dumping them again (measured by bench/service/export_vs_lookup.py's author)."""
        check_page(limit, after)
        stmt = q.export_json(hardware_id=hardware_id, kernel=kernel, after=after, limit=limit)
        rows = self._run("exporting records", lambda s: s.execute(stmt).all(), write=False)
        out = []
        for index, row in enumerate(rows):
            if index % _YIELD_EVERY == _YIELD_EVERY - 1:
                time.sleep(0)  # hand the GIL to this process's other threads (a service's lookups)
            out.append((row.id, q.export_text(row)))
        return out

    def best(self, key: RecordKey) -> Record | None:
        """The stored record for exactly this key (of its timing policy), or None."""
        params = q.key_params(key.checked())
        row = self._lookup("looking up a record", lambda conn: conn.execute(q.EXACT, params).first())
        return None if row is None else q.to_record(row)

    def nearest(self, key: RecordKey, *, limit: int = 1) -> list[tuple[Record, float]]:
        """Records of the key's kernel, hardware, dtype, world size and timing policy (and kernel_version
        unless None) with the same dim names, closest first: distance = Euclidean distance between the
        log2 of the dims (0 for the exact shape). Ties go to the lower p50, then the older record."""
        key = key.checked(versioned=False)
        params = q.key_params(key)
        check_page(limit, 0)
        versioned, shape = key.kernel_version is not None, key.shape

        def run(conn: sa.Connection) -> list[tuple[Record, float]]:
            if limit == 1 and versioned:  # the common lookup: one probe of the unique key
                exact = conn.execute(q.EXACT, params).first()
                if exact is not None:
                    return [(q.to_record(exact), 0.0)]
            stmt = q.nearest_lookup(tuple(shape), versioned)
            rows = conn.execute(stmt, {**params, **q.nearest_params(shape, limit)}).all()
            return [(q.to_record(row), q.distance(row.dist2)) for row in rows]

        return self._lookup("finding the nearest shapes", run)

    def get_record(self, record_id: int) -> Record | None:
        if not in_id_range(record_id):
            return None
        stmt = sa.select(RecordRow).where(RecordRow.id == record_id)
        return self._run("reading a record", lambda s: _first(s.scalars(stmt).first()), write=False)

    def list_records(self, where: RecordKey | None = None, *, limit: int = 100, offset: int = 0) -> list[Record]:
        """Records matching every field of `where` that is not None (`RecordKey.any(kernel="ag_gemm")`; None: all),
        in a stable order (kernel, hardware, dtype, shape, id)."""
        check_page(limit, offset)
        where = _filters(where)
        order = [getattr(RecordRow, name) for name in LIST_ORDER]  # the index ix_jt_records_list
        stmt = sa.select(RecordRow).where(*where).order_by(*order).limit(limit).offset(offset)
        rows = self._run("listing records", lambda s: s.scalars(stmt).all(), write=False)
        return [q.to_record(row) for row in rows]

    def count_records(self, where: RecordKey | None = None) -> int:
        """How many records match every field of `where` that is not None (None: all)."""
        where = _filters(where)
        stmt = sa.select(sa.func.count()).select_from(RecordRow).where(*where)
        return self._run("counting records", lambda s: int(s.execute(stmt).scalar_one()), write=False)

    def key_values(self, columns: Sequence[str], where: RecordKey, *, limit: int = 100) -> list[tuple[Any, ...]]:
        """The distinct values of some key `columns` among the records of `where`'s kernel (and of its hardware,
        dtype and world size where not None; its other fields are not read), in order, at most `limit` of them:
        what a lookup's miss says the store has nearby.

        The filters are a prefix of the lookup index, so the database reads that index's range instead of
        whole records (a miss's explanation loaded up to 1,000 full records: 100-270 ms)."""
        check_page(limit, 0)
        unknown = [name for name in columns if name not in q.KEY_VALUE_COLUMNS]
        if unknown or not columns:
            raise ValueError(f"columns: {unknown or columns!r} is not allowed; use some of {q.KEY_VALUE_COLUMNS}")
        if where.kernel is None:
            raise ValueError("where: a kernel is required; key values are read from one kernel's records")
        params = {k: v for k, v in where.where().items() if k in ("kernel", "hardware_id", "dtype", "world_size")}
        stmt = q.key_values(tuple(columns), tuple(params))
        return self._lookup(
            "reading a kernel's keys", lambda c: [tuple(r) for r in c.execute(stmt, {**params, "limit": limit})]
        )

    def hardware_ids(self, *, kernel: str | None = None, limit: int = 50) -> tuple[list[str], int]:
        """The first `limit` hardware ids (those with records of `kernel` where given), by name, and how many there
        are in all: what an unknown hardware's and a miss's messages list."""
        return self._names("hardware", kernel, limit)

    def kernel_names(self, *, limit: int = 50) -> tuple[list[str], int]:
        """The first `limit` kernel names with records, by name, and how many there are in all."""
        return self._names("kernels", None, limit)

    def _names(self, table: str, kernel: str | None, limit: int) -> tuple[list[str], int]:
        check_page(limit, 0)
        page, total = q.names(table, kernel is not None)
        params = {"limit": limit, **({"kernel": kernel} if kernel is not None else {})}

        def run(conn: sa.Connection) -> tuple[list[str], int]:
            found = list(conn.execute(page, params).scalars())
            return found, len(found) if len(found) < limit else int(conn.execute(total, params).scalar_one())

        return self._lookup(f"listing {table} names", run)

    def delete_record(self, record_id: int) -> bool:
        """Delete one record; False when no record has this id."""
        if not in_id_range(record_id):
            return False
        stmt = sa.delete(RecordRow.__table__).where(RecordRow.__table__.c.id == record_id)
        return self._run("deleting a record", lambda s: s.execute(stmt).rowcount > 0, write=True)

    # -- hardware and kernels -------------------------------------------------------------------

    def upsert_hardware(self, *, hardware_id: str, name: str, fingerprint: dict[str, Any]) -> HardwareProfile:
        """Create or update a hardware profile (name and fingerprint are replaced)."""
        checked = check_hardware(hardware_id, name, fingerprint)
        dialect = self.backend

        def run(session: Session) -> HardwareProfile:
            session.execute(q.upsert_hardware(dialect, hardware_id, checked.name, checked.fingerprint))
            row = session.scalars(sa.select(HardwareRow).where(HardwareRow.hardware_id == hardware_id)).one()
            return q.to_hardware(row)

        return self._run("saving a hardware profile", run, write=True)

    def get_hardware(self, hardware_id: str) -> HardwareProfile | None:
        stmt = sa.select(HardwareRow).where(HardwareRow.hardware_id == hardware_id)
        row = self._run("reading a hardware profile", lambda s: s.scalars(stmt).first(), write=False)
        return None if row is None else q.to_hardware(row)

    def list_hardware(self) -> list[HardwareProfile]:
        stmt = sa.select(HardwareRow).order_by(HardwareRow.hardware_id)
        rows = self._run("listing hardware", lambda s: s.scalars(stmt).all(), write=False)
        return [q.to_hardware(row) for row in rows]

    def upsert_kernel(self, *, name: str, version: str) -> KernelInfo:
        """Register a kernel version (publishing a record does this too); idempotent."""
        check_kernel(name, version)
        dialect = self.backend

        def run(session: Session) -> KernelInfo:
            session.execute(q.ensure_kernel(dialect, name, version))
            stmt = sa.select(KernelRow).where(KernelRow.name == name, KernelRow.version == version)
            return q.to_kernel(session.scalars(stmt).one())

        return self._run("saving a kernel", run, write=True)

    def list_kernels(self, *, name: str | None = None) -> list[KernelInfo]:
        stmt = sa.select(KernelRow).order_by(KernelRow.name, KernelRow.created_at, KernelRow.id)
        if name is not None:
            stmt = stmt.where(KernelRow.name == name)
        rows = self._run("listing kernels", lambda s: s.scalars(stmt).all(), write=False)
        return [q.to_kernel(row) for row in rows]

    # -- plumbing -------------------------------------------------------------------------------

    def _run(self, action: str, fn: Callable[[Session], T], *, write: bool) -> T:
        """Run `fn` in one transaction; retry PostgreSQL deadlocks, wrap driver errors."""
        maker = self._write if write else self._read
        for attempt in range(_RETRIES):
            try:
                with maker() as session, session.begin():
                    return fn(session)
            except sa.exc.SQLAlchemyError as exc:
                if is_retryable(exc) and attempt + 1 < _RETRIES:
                    time.sleep(0.01 * 2**attempt)
                    continue
                raise store_error(self.url, action, exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _lookup(self, action: str, fn: Callable[[sa.Connection], T]) -> T:
        """Run the read-only `fn` on one pooled connection, errors wrapped as `_run` does.

        The lookups the service and kernels make on every cache miss: Core rows instead of ORM
        objects and no Session, and on PostgreSQL no transaction (autocommit): each of their one or
        two statements reads committed data by itself, so BEGIN and COMMIT would only add two round
        trips to the server.
        """
        try:
            with self._reader.connect() as conn:
                return fn(conn)
        except sa.exc.SQLAlchemyError as exc:
            raise store_error(self.url, action, exc) from exc


def _revision_in(session: Session) -> str | None:
    return current_revision(session.connection())


def _first(row: RecordRow | None) -> Record | None:
    return None if row is None else q.to_record(row)


_CACHE: dict[str, Store] = {}
_CACHE_LOCK = threading.Lock()


def open_store(url: str | None = None) -> Store:
    """The process-wide Store for a URL (resolved as `resolve_db_url` does), opened on first use."""
    resolved = resolve_db_url(url)
    with _CACHE_LOCK:
        store = _CACHE.get(resolved)
        if store is None:
            store = Store(resolved)
            _CACHE[resolved] = store
        return store


def _after_fork_in_child() -> None:
    # Pooled connections belong to the parent; closing them here would break its sockets.
    for store in _CACHE.values():
        store.engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _filters(where: RecordKey | None) -> list[sa.ColumnElement[bool]]:
    """The filters of `list_records` and `count_records` (a timing that is not a policy is refused)."""
    given = {} if where is None else where.where()
    check_timing(given.get("timing"))
    if "shape" in given:
        given["shape_key"] = shape_key(given.pop("shape"))
    return q.filters(**given)
