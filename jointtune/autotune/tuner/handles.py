"""One job's study as rank 0 sees it: open it by its key, initialise it once, publish its best.

The study name comes from the job's tuning key on this hardware (`keys`), so every group that
serves the job meets in the same study. The first group to open it (under the study lock) fills
its start (`search.initial_configs`): the baseline, the space default, the priors the store holds
(`priors`: nearest shapes, the same shape on another GPU of the same architecture or at another
world size; listed in the study's `jt_priors`), the seeds and one config of every mode (or, for
exhaustive studies, every valid config). When a trial becomes the
study's best, the record goes to the store right away, so a sweep killed half way still leaves
its best configs behind; every later trial raises that record's trial count (`note_trials`), so the
record says as many trials as the sweep's table.

Example:
    >>> h = StudyHandle.open(job, url=url, storage=storage, store=store, limits=limits,
    ...                      hardware_id=hw)                                     # doctest: +SKIP
    >>> h.state().best_value                                                     # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import optuna

from jointtune.autotune.tuner.keys import TuningKey, triton_version
from jointtune.autotune.tuner.locks import study_lock
from jointtune.autotune.tuner.priors import find_priors
from jointtune.autotune.tuner.search import Searcher, baseline_config, enqueue, initial_configs
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import (
    STUDY_BASELINE,
    STUDY_INIT,
    STUDY_JOB,
    STUDY_KEY,
    STUDY_PRIORS,
    STUDY_SPACE,
    StudyState,
    trial_config,
)
from jointtune.errors import TuningError
from jointtune.search_spaces import canonical_json

if TYPE_CHECKING:
    from jointtune.db import Store
    from jointtune.kernels import Family
    from jointtune.search_spaces import DeviceLimits, Space


def resolve_space(family: Family) -> Space:
    """A family's space: by name from the registry, or the Space object itself."""
    from jointtune.search_spaces import Space, get_space

    space: Any = family.space
    return space if isinstance(space, Space) else get_space(space)


def study_space(family: Family, settings: TuneSettings) -> Space:
    """The space a study searches: the family's, narrowed by the `restrict` setting.

    A restriction of `mode` keeps "baseline": every study measures the unfused path first, for its
    speed-ups and its watchdog's time limits. The space's non-deterministic modes (results that may
    differ in the last bits between identical calls) stay out unless `allow_nondeterministic` is set;
    a `restrict` that names one without it is an error. Leaving them out narrows the space, so its
    version, and with it the study, differs from the one that allows them.
    """
    space = resolve_space(family)
    restrict = {name: list(values) for name, values in settings.restrict}
    if space.nondeterministic and not settings.allow_nondeterministic:
        mode = space.param("mode")
        if "mode" in restrict:
            asked = [mode.canonical(v) for v in restrict["mode"]]
            refused = [m for m in space.nondeterministic if m in asked]
            if refused:
                raise TuningError(
                    f"restrict.mode: {refused[0]!r} is not allowed without allow_nondeterministic ({space.name} "
                    f"mode {refused[0]!r} is non-deterministic: results may differ in the last bits between "
                    "identical calls); allow it with --allow-nondeterministic on the command line, "
                    "`allow_nondeterministic: true` in a sweep file or TuneSettings(allow_nondeterministic=True)"
                )
        else:
            restrict["mode"] = [m for m in space.modes if m not in space.nondeterministic]
    if not restrict:
        return space
    if "mode" in restrict and "baseline" in space.modes and "baseline" not in restrict["mode"]:
        restrict["mode"].append("baseline")
    return space.restrict(restrict)


class StudyHandle:
    """Family, space, key and Optuna study of one job, plus its last known baseline latency."""

    def __init__(
        self, job: Job, study: optuna.Study, family: Family, space: Space, key: TuningKey, limits: DeviceLimits
    ) -> None:
        self.job, self.study, self.family, self.space, self.key = job, study, family, space, key
        self.problem = key.problem
        self.limits = limits
        self.searcher = Searcher(space, self.problem, limits, job.settings)
        self.baseline_us: float | None = None

    @classmethod
    def open(
        cls,
        job: Job,
        *,
        url: str,
        storage: optuna.storages.BaseStorage,
        store: Store,
        limits: DeviceLimits,
        hardware_id: str,
    ) -> StudyHandle:
        """Create or load the job's study; the first opener initialises it."""
        from jointtune.kernels import get_family

        family = get_family(job.kernel)
        space = study_space(family, job.settings)
        problem = space.make_problem(dict(job.shape), dtype=job.dtype, world_size=job.world_size)
        key = TuningKey.of(family.name, family.version, problem, hardware_id, job.settings.timing)
        name = key.study_name(space_version=space.version, exhaustive=job.settings.strategy == "exhaustive")
        study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
        handle = cls(job, study, family, space, key, limits)
        if not study.user_attrs.get(STUDY_INIT):
            with study_lock(url, name):
                if not study.user_attrs.get(STUDY_INIT):
                    handle._initialise(store)
        store.upsert_kernel(name=family.name, version=family.version)
        return handle

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def exhaustive(self) -> bool:
        return self.job.settings.strategy == "exhaustive"

    def _initialise(self, store: Store) -> None:
        priors = []
        if self.job.settings.warm_start and not self.exhaustive:
            priors = find_priors(store, self.key, limit=self.job.settings.warm_start)
        queue = initial_configs(self.space, self.problem, self.limits, warm=priors, exhaustive=self.exhaustive)
        enqueue(self.study, queue)
        self.study.set_user_attr(STUDY_PRIORS, [start.source for start in queue if start.source is not None])
        self.study.set_user_attr(STUDY_JOB, self.job.to_json())
        self.study.set_user_attr(STUDY_KEY, self.key.to_json())
        self.study.set_user_attr(STUDY_SPACE, self.space.name)
        baseline = baseline_config(self.space, self.problem, self.limits)
        self.study.set_user_attr(STUDY_BASELINE, canonical_json(baseline))
        self.study.set_user_attr(STUDY_INIT, True)

    def state(self) -> StudyState:
        """Where the study stands now (read fresh from the storage)."""
        trials = self.study.get_trials(deepcopy=False)
        state = StudyState.of(trials, attrs=self.study.user_attrs, exhaustive=self.exhaustive)
        self.baseline_us = state.baseline_us
        return state

    def publish(self, state: StudyState, *, store: Store, limits: DeviceLimits) -> None:
        """Write the study's best to the store, which keeps the faster of old and new; after a final round
        (`finalists`), its pick replaces what this study stored before, whatever the two p50s."""
        from jointtune.db import NewRecord

        best = state.best
        p10, p50, p90 = state.best_percentiles()
        assert best is not None and p50 is not None
        record = NewRecord.for_key(
            self.key,
            space_version=self.space.version,
            triton_version=triton_version(),
            config=self.space.validate(trial_config(best), self.problem, limits),
            latency_p10_us=p10,
            latency_p50_us=float(p50),
            latency_p90_us=p90,
            baseline_us=state.baseline_us,
            trials=state.trial_count,
            study_name=self.name,
        )
        store.upsert_record(record, supersede=state.final is not None)

    def note_trials(self, state: StudyState, *, store: Store) -> None:
        """Raise the trial count of the record this study made for its key to the study's count."""
        store.note_trials(self.key, study_name=self.name, trials=state.trial_count)
