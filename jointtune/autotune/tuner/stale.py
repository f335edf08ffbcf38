"""Keys a new kernel or space version left behind, and the jobs that tune them again (`jointtune retune`).

A record is keyed by its family's kernel version (`jointtune.kernels.runtime.version`), so after an upgrade that changes
a kernel, its shared runtime or the way it launches, no lookup finds the old records: the decorator falls back to
the nearest tuned shape or the default. A record also carries its space version: when a space gains a knob, a
record searched in the older space still serves (lookups check each config against today's space), but it never
saw the new choices. Both kinds of key are found here, from the store alone, with the settings their last study
ran with, so a user gets their tuned shapes back without retyping them.

Example:
    >>> from jointtune.db import Store                                     # doctest: +SKIP
    >>> for key in find_stale(Store(url), url, hardware_id=detect().hardware_id):  # doctest: +SKIP
    ...     print(key.record.shape, key.reason, key.job or key.why_not)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jointtune.canonical import shape_key
from jointtune.errors import JointtuneError

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import Job, TuneSettings
    from jointtune.db import Record, Store
    from jointtune.kernels import Family
    from jointtune.search_spaces import Space

_PAGE = 1000


@dataclass(frozen=True)
class StaleKey:
    """One key whose best record predates today's kernel or space version."""

    #: the record left behind (the newest one of the key, if several old versions hold it)
    record: Record
    #: what changed, e.g. "kernel 3f2a9c1d0e4b -> 9c1d2e3f4a5b"
    reason: str
    #: the tune that brings the key back, or None with `why_not` when it can't run here
    job: Job | None
    why_not: str | None = None
    #: the record's config is refused by today's space: no lookup serves it, and a re-tune replaces it
    refused: bool = False


def all_records(store: Store, *, kernel: str | None = None) -> Iterator[Record]:
    """Every record of the store (of one kernel if given), page by page."""
    from jointtune.db import RecordKey

    offset = 0
    while True:
        page = store.list_records(RecordKey.any(kernel=kernel), limit=_PAGE, offset=offset)
        yield from page
        if len(page) < _PAGE:
            return
        offset += _PAGE


def study_settings(url: str, study_name: str | None) -> TuneSettings | None:
    """The settings the record's study ran with, if that study is in the storage on `url` and still readable."""
    if not study_name:
        return None
    from jointtune.autotune.tuner.settings import Job
    from jointtune.autotune.tuner.studies import STUDY_JOB, open_storage

    storage = open_storage(url)
    try:
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(study_name))
        return Job.from_json(attrs[STUDY_JOB]).settings
    except (KeyError, TypeError, ValueError, JointtuneError):  # no such study, or one of an older tuner
        return None


def find_stale(
    store: Store, url: str, *, hardware_id: str, kernel: str | None = None, trials: int | None = None
) -> tuple[list[StaleKey], list[str]]:
    """The keys of `store` left behind by a kernel or space version, and the kernels not checked (no family of
    that name is registered in this process). A re-tune runs the settings of the record's study where the storage
    has it (`trials` overrides the budget), on this machine only: other hardware ids are listed with the reason."""
    from jointtune.kernels import get_family

    groups: dict[tuple, list[Record]] = {}
    for rec in all_records(store, kernel=kernel):
        key = (rec.kernel, shape_key(rec.shape), rec.dtype, rec.world_size, rec.hardware_id, rec.timing)
        groups.setdefault(key, []).append(rec)
    stale: list[StaleKey] = []
    unknown: set[str] = set()
    for (name, *_), records in groups.items():
        try:
            family = get_family(name)
        except JointtuneError:
            unknown.add(name)
            continue
        found = _stale_key(family, records, url, hardware_id=hardware_id, trials=trials)
        if found is not None:
            stale.append(found)
    return stale, sorted(unknown)


def _stale_key(
    family: Family, records: list[Record], url: str, *, hardware_id: str, trials: int | None
) -> StaleKey | None:
    from jointtune.autotune.tuner.handles import resolve_space, study_space
    from jointtune.autotune.tuner.search import check_study
    from jointtune.autotune.tuner.settings import Job, TuneSettings

    current = [r for r in records if r.kernel_version == family.version]
    record = current[0] if current else max(records, key=lambda r: (r.updated_at, r.id))
    settings = study_settings(url, record.study_name) or TuneSettings(timing=record.timing)
    if trials is not None:
        settings = settings.replace(trials=trials)
    try:
        space = study_space(family, settings)
    except JointtuneError:  # the old study's restriction names what today's space no longer has
        settings = TuneSettings(timing=record.timing, **({} if trials is None else {"trials": trials}))
        space = study_space(family, settings)
    full = resolve_space(family)
    refused = False
    if not current:
        reason = f"kernel {record.kernel_version} -> {family.version}"
    elif record.space_version in (space.version, full.version):
        return None
    else:
        reason = f"space {record.space_version} -> {full.version}"
        refused = _refused(full, record)
    why_not = None
    job = None
    if record.hardware_id != hardware_id:
        why_not = f"tuned on {record.hardware_id}: run `jointtune retune` there (this machine is {hardware_id})"
    else:
        try:
            problem = family.stored_problem(
                space.make_problem(record.shape, dtype=record.dtype, world_size=record.world_size)
            )
            check_study(space, problem, settings)
            job = Job.of(family.name, problem, settings)
        except JointtuneError as exc:
            why_not = f"can't be tuned with today's space: {exc}"
    return StaleKey(record=record, reason=reason, job=job, why_not=why_not, refused=refused)


def _refused(space: Space, record: Record) -> bool:
    """Whether `space` refuses the record's config (then no lookup serves it)."""
    from jointtune.search_spaces import Problem

    try:
        problem = Problem.of(record.shape, dtype=record.dtype, world_size=record.world_size)
        space.check_record(record.config, problem)
    except JointtuneError:
        return True
    return False
