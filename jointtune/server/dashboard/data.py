"""What the dashboard shows, read from the store and from Optuna's storage on the same database.

Reads are bounded so a page stays cheap on a large store: `PAGE_RECORDS` records a page, in the store's
list order (an index: `ix_jt_records_list`), and the `MAX_STUDIES` newest studies, on the first page only.
All 5,000 records on one page made it 6.1 MB and 1.8 s on PostgreSQL (issue 38). Optuna's tables are never created
from here: a database where nothing was tuned yet simply has no studies, and a storage that can't
be read is reported on the page instead of failing it (the records are still worth showing).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from jointtune.db import Record, Store

if TYPE_CHECKING:
    import optuna

log = logging.getLogger("jointtune.server")

PAGE_RECORDS = 200
MAX_STUDIES = 24
#: the sweep registry keeps its jobs in studies of its own; they have no trials to plot
_REGISTRY_PREFIX = "jointtune-sweep:"


@dataclass(frozen=True)
class CurvePoint:
    """One complete trial: its number, its own value and the best value up to and including it."""

    number: int
    value: float
    best: float


@dataclass(frozen=True)
class StudyCurve:
    """Best latency vs trial for one study, with a label built from the key the tuner stored."""

    name: str
    label: str
    points: tuple[CurvePoint, ...]
    failed: int
    minimize: bool = True

    @property
    def best(self) -> float | None:
        return self.points[-1].best if self.points else None


@dataclass
class DashboardData:
    """Everything a page renders: its records (page `page` of `per_page`), the store's counts, and on the first
    page the tuning curves; `studies_error` is set when Optuna's storage could not be read."""

    records: list[Record] = field(default_factory=list)
    total_records: int = 0
    curves: list[StudyCurve] = field(default_factory=list)
    total_studies: int = 0
    studies_error: str | None = None
    page: int = 1
    per_page: int = PAGE_RECORDS
    kernels: int = 0
    hardware: int = 0

    @property
    def pages(self) -> int:
        """How many pages the records fill (an empty store has one, empty)."""
        return max(1, -(-self.total_records // self.per_page))

    def groups(self) -> list[tuple[tuple[str, str], list[Record]]]:
        """Records by (kernel, hardware_id), both sorted by name."""
        grouped: dict[tuple[str, str], list[Record]] = {}
        for record in self.records:
            grouped.setdefault((record.kernel, record.hardware_id), []).append(record)
        return sorted(grouped.items())


def shape_order(shape: dict[str, int]) -> tuple[Any, ...]:
    """Sort key for shapes: shapes of one kind together, then by their dims in reading order (M first for the GEMMs,
    batch B first for decode attention)."""
    names = dim_names(shape)
    return (tuple(sorted(shape)), tuple(shape[name] for name in names))


def dim_names(shape: dict[str, int]) -> list[str]:
    """Dims in reading order: as the registered spaces name them (M, N, K; B, H, H_KV, S, D), the rest by name."""
    order = _reading_order()
    known = sorted((name for name in shape if name in order), key=order.index)
    return known + sorted(name for name in shape if name not in order)


@functools.cache
def _reading_order() -> tuple[str, ...]:
    from jointtune.search_spaces import get_space, space_names

    names: list[str] = []
    for space in space_names():
        names += [d for d in get_space(space).dims if d not in names]
    return tuple(names)


def read_records(store: Store, *, page: int = 1, per_page: int = PAGE_RECORDS) -> tuple[list[Record], int]:
    """Page `page` (from 1) of the records in the store's list order, and how many records there are in all."""
    records = store.list_records(limit=per_page, offset=(page - 1) * per_page)
    first = (page - 1) * per_page
    total = first + len(records) if 0 < len(records) < per_page else store.count_records()
    return records, total


def open_optuna(store: Store) -> optuna.storages.RDBStorage | None:
    """Optuna's storage on the store's URL, or None when Optuna's tables don't exist (nothing tuned)."""
    import optuna

    if not sa.inspect(store.engine).has_table("studies"):
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(store.url, engine_kwargs=store.optuna_engine_kwargs(), skip_table_creation=True)


def read_curves(storage: optuna.storages.RDBStorage, *, limit: int = MAX_STUDIES) -> tuple[list[StudyCurve], int]:
    """Curves of the `limit` newest single-objective studies that have trials, and the study count."""
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    studies = [
        s for s in storage.get_all_studies() if not s.study_name.startswith(_REGISTRY_PREFIX) and len(s.directions) == 1
    ]
    # newest first; FrozenStudy keeps its id private, and asking by name would cost a query per study
    studies.sort(key=lambda s: s._study_id, reverse=True)
    curves: list[StudyCurve] = []
    for study in studies[:limit]:
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
        minimize = study.directions[0] != StudyDirection.MAXIMIZE
        done = sorted(
            (t for t in trials if t.state == TrialState.COMPLETE and _finite(t.value)), key=lambda t: t.number
        )
        failed = sum(1 for t in trials if t.state in (TrialState.PRUNED, TrialState.FAIL))
        points: list[CurvePoint] = []
        best: float | None = None
        for trial in done:
            value = float(trial.value)  # type: ignore[arg-type]
            if best is None or (value < best if minimize else value > best):
                best = value
            points.append(CurvePoint(trial.number, value, best))
        curves.append(
            StudyCurve(
                study.study_name, study_label(study.study_name, study.user_attrs), tuple(points), failed, minimize
            )
        )
    return curves, len(studies)


def study_label(name: str, attrs: dict[str, Any]) -> str:
    """'ag_gemm · M=8192 N=4096 K=12288 · bfloat16 · w2 · hw' from the tuner's key attr, else the name."""
    key = attrs.get("jt_key")
    if not isinstance(key, dict) or not isinstance(key.get("shape"), dict):
        return name
    shape = key["shape"]
    dims = " ".join(f"{d}={shape[d]}" for d in dim_names(shape))
    parts = [key.get("kernel"), dims, key.get("dtype"), f"w{key.get('world_size')}", key.get("hardware_id")]
    return " · ".join(str(part) for part in parts if part)


def collect(
    store: Store, *, page: int = 1, per_page: int = PAGE_RECORDS, max_studies: int = MAX_STUDIES
) -> DashboardData:
    """Read a page of records, the store's counts, and on the first page the tuning curves; a broken Optuna
    storage becomes `studies_error`."""
    records, total = read_records(store, page=page, per_page=per_page)
    kernels = len({k.name for k in store.list_kernels()})
    data = DashboardData(records=records, total_records=total, page=page, per_page=per_page, kernels=kernels,
                         hardware=store.hardware_ids(limit=1)[1])  # fmt: skip
    if page != 1:
        return data
    try:
        storage = open_optuna(store)
        if storage is not None:
            try:
                data.curves, data.total_studies = read_curves(storage, limit=max_studies)
            finally:
                storage.engine.dispose()
    except Exception as exc:  # any storage problem is shown on the page, not a 500
        log.warning("dashboard: reading Optuna studies from %s failed: %s", store.display_url, exc)
        data.studies_error = f"Optuna studies in this database could not be read ({type(exc).__name__})"
    return data


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
