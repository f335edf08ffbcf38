"""From Optuna suggestions to configs worth running: samplers, invalid and repeated configs, warm start.

- Samplers: multivariate TPE with `group=True` (params that only exist under one `mode` form their
  own groups) and `constant_liar=True` (trials running in other groups count as pending). A fresh
  sampler is built for every ask, seeded from the study's seed and how many trials it holds, so a
  study's suggestions depend only on its history: a resumed or restarted study asks exactly what an
  uninterrupted one would have, and two fresh studies with the same seed ask the same.
- Proposals inside the valid space: the sampler is wrapped by the space (`Space.sampler`), so a draw
  that breaks a rule of the problem or the device is drawn again (or, as a last resort, moved to the
  nearest valid config of its mode) before it becomes a trial; the trial notes what happened and why
  (`jt_moved`). A config the space still refuses (an enqueued one, or fixed values that leave nothing
  valid) never reaches a rank: it is told PRUNED with reason "invalid" (`jt_refused` names the rules it
  broke) and doesn't count; a streak of them stops the study.
- A config that already has a result is answered from it (`jt_cached`) instead of run again, and
  the next trial is the first config without a result one step from the study's fastest few
  (`Searcher.neighbour_config`: TPE tends to propose its incumbent again and again, so a repeat turns
  into a local search that two tunes walk alike), else a valid config without a result drawn at
  random (`Space.config_at` picks it without walking the enumeration); when
  no such config is left the search says "exhausted" (the coordinator stops the study then only
  once no claimed trial is left to run). A config that a claimed trial is running right now is
  skipped (told FAIL, reason "duplicate"). A stop's reason in words goes to the study (`jt_stop_detail`).
- What comes next (`Searcher.preview`): the configs the next claims will run as far as they don't depend on
  results (the enqueued start, then the sampler's random draws), asked of an in-memory copy of the study,
  so compile pools can build them ahead; the study itself is untouched.
- Up front (`check_study`): a restriction that leaves nothing it asked for, and an exhaustive
  study bigger than its budget, are refused before any rank starts.
- The start (`initial_configs`), enqueued in a fixed order before any sampling: the baseline (in each
  collective variant), the space default, the priors (`priors`: tuned configs of neighbouring shapes,
  world sizes and GPUs), the space's seeds, then one config of every mode not covered yet
  (`Space.mode_starts`); exhaustive studies enqueue every valid config.

Example:
    >>> searcher = Searcher(space, problem, limits, settings)                # doctest: +SKIP
    >>> proposal = searcher.propose(study)                                   # doctest: +SKIP
    >>> proposal.config if isinstance(proposal, Proposal) else proposal      # doctest: +SKIP
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import optuna
from optuna.trial import TrialState

from jointtune.autotune.tuner.studies import (
    ATTR_CACHED,
    ATTR_CONFIG,
    ATTR_DETAIL,
    ATTR_MOVED,
    ATTR_P10,
    ATTR_P50,
    ATTR_P90,
    ATTR_PRIOR,
    ATTR_REASON,
    ATTR_REFUSED,
    ATTR_ROLE,
    STUDY_STOP_DETAIL,
    quiet_optuna,
    trial_config,
    trial_kind,
)
from jointtune.search_spaces import canonical_json, rule_field

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import TuneSettings
    from jointtune.search_spaces import DeviceLimits, Problem, Space

#: invalid proposals in a row after which the sampler is handed a valid unseen config from the walk. The space's
#: sampler proposes valid configs only, so this is a backstop for fixed values (a two-stage search's) that leave
#: the sampler nothing valid to move to
_INVALID_NUDGE = 20
_HISTORY_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
#: how many of a study's fastest configs a repeated proposal explores around (`Searcher.neighbour_config`)
_NEIGHBOURHOOD = 8


def sampler_seed(seed: int, n_history: int) -> int:
    """The seed of the sampler for the next ask: the study seed mixed with the history length."""
    return (seed * 1_000_003 + n_history * 7_919 + 17) % (2**31 - 1)


def make_sampler(strategy: str, seed: int, n_history: int, *, startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    """The sampler for the next ask (`sampler_seed`); the Searcher wraps it in the space's (`Space.sampler`)."""
    mixed = sampler_seed(seed, n_history)
    if strategy == "tpe":
        with quiet_optuna():
            return optuna.samplers.TPESampler(
                multivariate=True,
                group=True,
                constant_liar=True,
                seed=mixed,
                n_startup_trials=startup_trials,
            )
    return optuna.samplers.RandomSampler(seed=mixed)


def baseline_config(space: Space, problem: Problem, limits: DeviceLimits) -> dict[str, Any]:
    """The unfused path every study measures first (see `Space.baseline`)."""
    return space.baseline(problem, limits)


def baseline_variants(space: Space, base: Mapping[str, Any], limits: DeviceLimits) -> list[dict[str, Any]]:
    """The baseline in each of its other collective variants (`search_spaces._collectives`), where the space has the
    knob: a study measures them all first, so its best is never slower than the fastest unfused path. None in the
    interpreter: simulated ranks run one collective for every variant."""
    if limits.interpreter or base.get("mode") != "baseline" or "collective" not in {p.name for p in space.params}:
        return []
    return [{**base, "collective": c} for c in space.param("collective").choices if c != base.get("collective")]


def _at(space: Space, problem: Problem) -> str:
    return ",".join(f"{d}={problem.dim(d)}" for d in space.dims)


def check_study(space: Space, problem: Problem, settings: TuneSettings) -> None:
    """Refuse a study that can't run as asked before any rank starts (TuningError: the CLI exits 2, a
    sweep file names the job): a restriction that leaves it nothing to tune, or an exhaustive study
    bigger than its trial budget. The space is counted once, for both."""
    exhaustive = settings.strategy == "exhaustive"
    if not settings.restrict and not exhaustive:
        return
    from jointtune.errors import TuningError
    from jointtune.search_spaces import DeviceLimits

    limits = DeviceLimits.nominal_hopper()
    count = space.count(problem, limits)
    if settings.restrict:
        _check_restriction(space, problem, settings, count, limits)
    if exhaustive and count > settings.trials:
        # such a study measures every valid config, and a space of tens of thousands would run for hours
        raise TuningError(
            f"trials: {settings.trials} is not allowed for an exhaustive study of {space.name} at "
            f"{_at(space, problem)}, which has {count:,} valid configs; "
            f"allowed: >= {count:,} "
            f"(or narrow the space with --restrict / a sweep job's `restrict`)"
        )


def _check_restriction(
    space: Space, problem: Problem, settings: TuneSettings, count: int, limits: DeviceLimits
) -> None:
    """Refuse a restriction that leaves no valid config of what it asked for at this problem (`count`: the
    restricted space's valid configs).

    Why: `study_space` keeps `mode: baseline` in every sub-space that narrows `mode`, so such a study
    would not be empty: it would measure only the baseline and store that as its tuned result. A
    restriction that asks for the baseline itself (`mode=baseline`) is a study of it, and allowed.
    """
    from jointtune.errors import TuningError

    left = count
    if "baseline" in space.modes and not _asks_for_baseline(space, settings):
        left -= space.count(problem, limits, where={"mode": "baseline"})
    if left == 0:
        asked = " ".join(f"{name}={','.join(map(str, values))}" for name, values in settings.restrict)
        but = "" if count == 0 else " but the baseline (which every study measures anyway)"
        raise TuningError(
            f"restrict: {asked} leaves {space.name} no valid config{but} at {_at(space, problem)}, "
            f"{problem.dtype}, world size {problem.world_size}; allow more values"
        )


def _asks_for_baseline(space: Space, settings: TuneSettings) -> bool:
    modes = dict(settings.restrict).get("mode", ())
    return any(space.param("mode").canonical(m) == "baseline" for m in modes)


class Start(NamedTuple):
    """One config of a study's start: why it is there (`role`), the config, and for a prior where it came from."""

    role: str
    config: dict[str, Any]
    source: dict[str, Any] | None = None


@dataclass(frozen=True)
class Prior:
    """A tuned config from elsewhere (another shape, world size or GPU), with where it came from (`source`: plain
    JSON, noted on its trial)."""

    config: Mapping[str, Any]
    source: Mapping[str, Any] = field(default_factory=dict)


def initial_configs(
    space: Space,
    problem: Problem,
    limits: DeviceLimits,
    *,
    warm: Iterable[Mapping[str, Any] | Prior] = (),
    exhaustive: bool = False,
) -> list[Start]:
    """The start, enqueued before any sampling, in this order: the baseline (in each collective variant the device
    runs), the default, the warm configs (priors), the space's seeds, then one config of each mode not covered yet
    (`Space.mode_starts`), and for exhaustive studies every other valid config. Repeats are dropped; a warm config
    the space refuses here (tuned at another world size or on another GPU, say) is moved to the nearest valid one,
    and its source says which fields moved (`adapted`); other refused configs are dropped."""
    out: list[Start] = []
    seen: set[str] = set()

    def add(role: str, config: Mapping[str, Any], source: Mapping[str, Any] | None = None) -> None:
        if space.violations(config, problem, limits):
            return
        canonical = space.validate(config, problem, limits)
        key = canonical_json(canonical)
        if key not in seen:
            seen.add(key)
            out.append(Start(role, canonical, dict(source) if source is not None else None))

    base = baseline_config(space, problem, limits)
    add("baseline", base)
    for variant in baseline_variants(space, base, limits):  # the best unfused path is the fastest of them
        add("baseline", variant)
    # A sub-space (`Space.restrict`) that excludes the family default gets no stand-in for it under that name:
    # its mode is covered below, by the valid config of that mode nearest to it.
    full = space.restricted_from
    if full is None or not space.violations(full.default(problem, limits), problem, limits):
        add("default", space.default(problem, limits))
    for item in warm:
        config, source = (item.config, dict(item.source)) if isinstance(item, Prior) else (item, None)
        add("warm", *_adapted(space, problem, limits, config, source))
    for config in space.seeds(problem, limits):
        add("seed", config)
    covered = {start.config.get("mode") for start in out}
    for config in space.mode_starts(problem, limits):
        if config.get("mode") not in covered:
            add("mode", config)
    if exhaustive:
        for config in space.enumerate(problem, limits):
            add("grid", config)
    return out


def _adapted(
    space: Space, problem: Problem, limits: DeviceLimits, config: Mapping[str, Any], source: dict[str, Any] | None
) -> tuple[Mapping[str, Any], dict[str, Any] | None]:
    """A warm config as this problem takes it: as given if valid, else the nearest valid config (the source, made
    if there was none, lists the fields that moved)."""
    if not space.violations(config, problem, limits):
        return config, source
    near = space.nearest_valid(config, problem, limits)
    if near is None:
        return config, source
    moved = sorted(name for name in {*config, *near} if config.get(name) != near.get(name))
    return near, {**(source or {}), "adapted": moved}


def enqueue(study: optuna.Study, configs: Sequence[Start | tuple[str, Mapping[str, Any]]]) -> None:
    """Enqueue a start in order; each trial notes its role (and a prior its source)."""
    for entry in configs:
        role, config = entry[0], entry[1]
        attrs: dict[str, Any] = {ATTR_ROLE: role}
        source = entry[2] if len(entry) > 2 else None
        if source is not None:
            attrs[ATTR_PRIOR] = source
        study.enqueue_trial(dict(config), user_attrs=attrs)


@dataclass
class Proposal:
    """A claimed trial and the valid, not yet measured config it will run."""

    trial: optuna.Trial
    config: dict[str, Any]

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def key(self) -> str:
        return canonical_json(self.config)


def _known_results(study: optuna.Study) -> tuple[dict[str, optuna.trial.FrozenTrial], set[str]]:
    """(config -> its first finished result, configs of trials running right now)."""
    known: dict[str, optuna.trial.FrozenTrial] = {}
    running: set[str] = set()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
        if ATTR_CONFIG not in trial.user_attrs:
            continue
        if trial.state == TrialState.RUNNING:
            running.add(trial.user_attrs[ATTR_CONFIG])
        elif trial_kind(trial) in ("ok", "failed"):
            known.setdefault(trial.user_attrs[ATTR_CONFIG], trial)
    return known, running


class Searcher:
    """Asks Optuna until it gets a config that is valid and new, or says why it should stop."""

    def __init__(
        self,
        space: Space,
        problem: Problem,
        limits: DeviceLimits,
        settings: TuneSettings,
        *,
        fixed: Mapping[str, Any] | None = None,
    ) -> None:
        self.space, self.problem, self.limits, self.settings = space, problem, limits, settings
        self.fixed = dict(fixed or {})

    def propose(
        self,
        study: optuna.Study,
        *,
        on_ask: Callable[[optuna.Trial], None] | None = None,
        results_free: bool = False,
    ) -> Proposal | str:
        """A Proposal, or the stop reason "invalid-streak" / "exhausted".

        `on_ask` sees every trial right after Optuna creates it (the coordinator stamps its owner
        there, so a process that dies mid-proposal leaves no trial nobody can account for).
        `results_free` (for `preview`): answer "depends-on-results" instead of a config that the
        results would choose (a repeat's neighbour).
        """
        known, running = _known_results(study)
        invalid = repeated = 0
        explore = False
        while True:
            n_history = len(study.get_trials(deepcopy=False, states=_HISTORY_STATES))
            base = make_sampler(
                self.settings.strategy, self.settings.seed, n_history, startup_trials=self.settings.startup_trials
            )
            sampler = self.space.sampler(
                base, self.problem, self.limits, seed=sampler_seed(self.settings.seed, n_history)
            )
            study.sampler = sampler
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if explore and not waiting:
                total = self.space.count(self.problem, self.limits, where=self.fixed or None)
                taken = set(known) | running
                if results_free and repeated:
                    return "depends-on-results"
                fresh = self.neighbour_config(known, taken) if repeated else None
                if fresh is None:
                    fresh = self.unseen_config(taken, total=total, seed=self.settings.seed * 7_919 + n_history)
                if fresh is None:
                    return self._stop(study, "exhausted", f"every one of the {total:,} valid configs has a result")
                study.enqueue_trial(fresh)
            elif self.fixed and not waiting:
                study.enqueue_trial(self.fixed)
            with quiet_optuna():
                trial = study.ask()
            if on_ask is not None:
                on_ask(trial)
            try:
                config = self.space.suggest(trial, self.problem, self.limits)
                problems = self.space.violations(config, self.problem, self.limits)
            except Exception as exc:  # a fixed param outside its choices, say
                config, problems = dict(trial.params), [str(exc)]
            key = canonical_json(config)
            trial.set_user_attr(ATTR_CONFIG, key)
            moved = sampler.moved.get(trial._trial_id)
            if moved is not None:
                trial.set_user_attr(ATTR_MOVED, moved)
            if problems:
                trial.set_user_attr(ATTR_REASON, "invalid")
                trial.set_user_attr(ATTR_REFUSED, sorted({rule_field(m) for m in problems}))
                trial.set_user_attr(ATTR_DETAIL, "; ".join(problems)[:2000])
                study.tell(trial, state=TrialState.PRUNED)
                invalid += 1
                if invalid >= self.settings.max_invalid_streak:
                    return self._stop(study, "invalid-streak", f"the space refused {invalid} proposals in a row")
                if invalid % _INVALID_NUDGE == 0:
                    explore = True
                continue
            earlier = known.get(key)
            if earlier is None and key not in running:
                return Proposal(trial, dict(config))
            if earlier is None:  # another claimed trial runs this config now: skip, don't run it twice
                trial.set_user_attr(ATTR_REASON, "duplicate")
                study.tell(trial, state=TrialState.FAIL)
            else:
                self._answer_from(study, trial, earlier)
            repeated += 1
            explore = True
            if repeated >= self.settings.max_duplicate_streak:
                detail = f"{repeated} proposals in a row repeated configs that have a result or are running"
                return self._stop(study, "exhausted", detail)

    def preview(self, study: optuna.Study, *, depth: int, limit: int) -> list[dict[str, Any]]:
        """The configs the next claims will run, in order, as far as they don't depend on any result: the enqueued
        start, then the sampler's random draws (TPE's until its history holds `startup_trials` trials; every draw of
        `random`). Asked of an in-memory copy of the study under the coordinator's schedule (`depth` claims open at
        once, the oldest told first, with a made-up value nothing reads yet); the study is untouched. Advice for
        compiling ahead: a wrong guess costs a compile, never a trial."""
        copy = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="minimize")
        copy.add_trials(study.get_trials(deepcopy=False))
        out: list[dict[str, Any]] = []
        while len(out) < limit:
            running = copy.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            for trial in running[: max(0, len(running) - depth + 1)]:
                copy.tell(trial.number, 0.0)
            waiting = copy.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            n_history = len(copy.get_trials(deepcopy=False, states=_HISTORY_STATES))
            if not waiting and (self.settings.strategy != "random" and n_history >= self.settings.startup_trials):
                break  # from here TPE reads the results
            proposal = self.propose(copy, results_free=True)
            if isinstance(proposal, str):
                break
            out.append(proposal.config)
        return out

    @staticmethod
    def _stop(study: optuna.Study, reason: str, detail: str) -> str:
        """`reason`, with why in words noted on the study (read back only once the study is stopped)."""
        study.set_user_attr(STUDY_STOP_DETAIL, detail)
        return reason

    def neighbour_config(
        self, known: Mapping[str, optuna.trial.FrozenTrial], taken: Collection[str]
    ) -> dict[str, Any] | None:
        """The first valid config without a result one step from the study's fastest configs (`Space.neighbours`
        of each of the `_NEIGHBOURHOOD` fastest, fastest first), honouring `fixed`; None when they have none left.

        Why: TPE keeps proposing its incumbent in a small space, and the random config that answered such a repeat
        left the incumbents' neighbours to chance, so two tunes whose timings differed by noise explored different
        regions and kept different picks (on 4x H100 a fresh Flash-Decode tune never ran the fastest config, one
        knob from configs it had measured, which the other tune found). Walking the neighbours of the fastest few in
        a fixed order is what both tunes do alike."""
        measured = [t for t in known.values() if t.state == TrialState.COMPLETE and t.value is not None]
        measured.sort(key=lambda t: (t.value, t.number))
        for trial in measured[:_NEIGHBOURHOOD]:
            for config in self.space.neighbours(trial_config(trial), self.problem, self.limits):
                if any(config.get(k) != v for k, v in self.fixed.items()):
                    continue
                if canonical_json(config) not in taken:
                    return config
        return None

    def unseen_config(self, known: Collection[str], *, total: int, seed: int) -> dict[str, Any] | None:
        """A valid config without a result, uniformly at random (None when every one has one).

        Draws indices into the space's enumeration (honouring `fixed`; `Space.config_at` finds one without
        walking to it); after 64 draws that all have a result, picks among the rest by one pass.
        """
        where = self.fixed or None
        if total == 0:
            return None
        rng = random.Random(seed)
        for _ in range(64):
            config = self.space.config_at(rng.randrange(total), self.problem, self.limits, where=where)
            if config is not None and canonical_json(config) not in known:
                return config
        unseen = [
            c for c in self.space.enumerate(self.problem, self.limits, where=where) if canonical_json(c) not in known
        ]
        return rng.choice(unseen) if unseen else None

    @staticmethod
    def _answer_from(study: optuna.Study, trial: optuna.Trial, earlier: optuna.trial.FrozenTrial) -> None:
        trial.set_user_attr(ATTR_CACHED, earlier.number)
        if earlier.state == TrialState.COMPLETE:
            for name in (ATTR_P10, ATTR_P50, ATTR_P90):
                if name in earlier.user_attrs:
                    trial.set_user_attr(name, earlier.user_attrs[name])
            study.tell(trial, earlier.value)
        else:
            trial.set_user_attr(ATTR_REASON, earlier.user_attrs.get(ATTR_REASON, "error"))
            study.tell(trial, state=TrialState.PRUNED)
