"""The Optuna side of tuning: storage, what each trial counts as, and where a study stands.

Trial states carry our meaning:
  COMPLETE            a measured config (value = p50 µs; user attrs p10_us/p50_us/p90_us)
  PRUNED + fail_reason   a config that failed: compile, incorrect, timeout, crash or error count
                      against the budget; "invalid" (a config the space refused; never ran) does not,
                      and `jt_refused` names the fields or rules it broke. TPE ranks pruned trials
                      below every complete one, so it learns to avoid failing regions.
  jt_moved            the sampler's proposal broke a rule and was moved to the nearest valid config
                      (`{"fields": moved, "why": rules broken}`): it ran as moved, and counts
  jt_role, jt_prior   why a trial of the start is there (baseline, default, warm, seed, mode, grid)
                      and, for a prior (a warm start), where it came from (`priors`)
  jt_cached           a repeat suggestion answered from an earlier trial of the same config: free,
                      not counted, told with the earlier result so TPE's history stays truthful
  FAIL                interrupted (its group died, or it went stale): not a result; the same
                      params are enqueued again (`jt_retry_of`), so the trial still happens once;
                      or, with reason "duplicate", a suggestion that another trial runs right now
A study's state is derived from its trials alone, so every group on every node agrees on it.

Example:
    >>> storage = open_storage("sqlite:////tmp/jt.db", heartbeat_interval=5, grace_period=20)  # doctest: +SKIP
    >>> state = StudyState.of(study.get_trials(deepcopy=False), settings)                        # doctest: +SKIP
    >>> state.counted, state.best_value, state.done(settings)                                    # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from jointtune.autotune.tuner.finalists import FinalRound

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import TuneSettings

ATTR_REASON = "fail_reason"
ATTR_DETAIL = "fail_detail"
ATTR_CONFIG = "jt_config"
ATTR_OWNER = "jt_owner"
ATTR_DEADLINE = "jt_deadline"
ATTR_ROLE = "jt_role"
ATTR_CACHED = "jt_cached"
ATTR_RETRY_OF = "jt_retry_of"
ATTR_PRIOR = "jt_prior"
ATTR_MOVED = "jt_moved"
ATTR_REFUSED = "jt_refused"
ATTR_P10, ATTR_P50, ATTR_P90 = "p10_us", "p50_us", "p90_us"
#: host time (µs) to launch one call: what an eager caller pays per call even when the GPU is idle
ATTR_HOST = "host_us"
#: study user attrs
STUDY_JOB, STUDY_KEY, STUDY_SPACE, STUDY_BASELINE = "jt_job", "jt_key", "jt_space", "jt_baseline"
STUDY_INIT, STUDY_STOPPED = "jt_init", "jt_stopped"
#: study user attrs: why the search stopped, in words (beside the reason code in STUDY_STOPPED); the priors the
#: start holds (their sources, as the trials note them)
STUDY_STOP_DETAIL, STUDY_PRIORS = "jt_stop_detail", "jt_priors"
#: study user attr: the final round, the finalists timed again side by side (`finalists.FinalRound`)
STUDY_FINAL = "jt_final"
#: reasons that count as a trial (the config ran and failed); "invalid" never ran
COUNTED_FAILURES = frozenset({"compile", "incorrect", "timeout", "crash", "error"})

log = logging.getLogger(__name__)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Silence what Optuna says about the experimental features we rely on on purpose (heartbeats,
    grouped TPE, `fail_stale_trials`) and heartbeats outside `optimize` (we record them ourselves)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed", category=UserWarning)
        yield


def retry_interrupted(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue an interrupted trial's params again, so its config still runs exactly once."""
    attrs = {ATTR_RETRY_OF: trial.number}
    for name in (ATTR_ROLE, ATTR_PRIOR):
        if name in trial.user_attrs:
            attrs[name] = trial.user_attrs[name]
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)
    log.info("trial %d of %s was interrupted; enqueued it again", trial.number, study.study_name)


@functools.lru_cache(maxsize=16)
def open_storage(
    url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on the store's database URL (same busy-wait and timeout rules).

    One per (url, heartbeat) per process: opening checks Optuna's schema, which isn't free.
    Processes opening a fresh database together race to create Optuna's tables; the losers see
    "already exists" (or a duplicate version row) and find the tables on a retry.
    """
    import sqlalchemy.exc

    from jointtune.db import open_store

    engine_kwargs = open_store(url).optuna_engine_kwargs()

    def attempt() -> optuna.storages.RDBStorage:
        with quiet_optuna():
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=retry_interrupted if heartbeat_interval else None,
            )

    for retry in range(5):
        try:
            return attempt()
        except sqlalchemy.exc.DBAPIError:
            time.sleep(0.2 * (retry + 1))
    return attempt()


def trial_kind(trial: FrozenTrial) -> str:
    """'ok', 'failed', 'invalid', 'cached', 'skipped', 'running', 'waiting' or 'interrupted'."""
    if trial.state == TrialState.RUNNING:
        return "running"
    if trial.state == TrialState.WAITING:
        return "waiting"
    if trial.state == TrialState.FAIL:
        return "skipped" if trial.user_attrs.get(ATTR_REASON) == "duplicate" else "interrupted"
    if ATTR_CACHED in trial.user_attrs:
        return "cached"
    if trial.state == TrialState.COMPLETE:
        return "ok"
    reason = trial.user_attrs.get(ATTR_REASON)
    return "failed" if reason in COUNTED_FAILURES else "invalid"


def trial_config(trial: FrozenTrial) -> dict[str, Any]:
    text = trial.user_attrs.get(ATTR_CONFIG)
    return json.loads(text) if text else dict(trial.params)


def trial_duration_s(trial: FrozenTrial) -> float:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return 0.0
    return max(0.0, (trial.datetime_complete - trial.datetime_start).total_seconds())


def _unfused(config_text: str | None, baseline_text: str) -> bool:
    """Whether a trial ran the unfused path: the study's baseline, or the baseline in another collective variant
    (a study's baseline latency is the fastest of them: the best unfused path a user could write)."""
    if config_text is None:
        return False
    unfused = '"mode":"baseline"'  # as canonical JSON writes it (sorted keys, no spaces)
    return config_text == baseline_text or (unfused in baseline_text and unfused in config_text)


@dataclass
class StudyState:
    """Counts and best result of one study, derived from its trials (see the module docstring)."""

    counted: list[FrozenTrial] = field(default_factory=list)
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    best: FrozenTrial | None = None
    baseline_us: float | None = None
    elapsed_s: float = 0.0
    since_best: int = 0
    stopped: str | None = None
    exhaustive: bool = False
    #: proposals the space refused (never ran, no trial), by the field or rule they broke
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    #: trials whose sampler draws the space refused (drawn again, or at last moved to the nearest valid config)
    #: before they ran, by the field or rule the draws broke; how many draws that was; how many were moved
    moved: collections.Counter[str] = field(default_factory=collections.Counter)
    moved_trials: int = 0
    redrawn: int = 0
    moved_nearest: int = 0
    #: the sources of the priors (warm starts) the start holds, in trial order
    priors: list[dict[str, Any]] = field(default_factory=list)
    stop_detail: str | None = None
    #: the final round (`finalists`) that judged this study's trials, while their count is the one it judged
    final: FinalRound | None = None

    @classmethod
    def of(
        cls,
        trials: Sequence[FrozenTrial],
        *,
        attrs: Mapping[str, Any] | None = None,
        exhaustive: bool = False,
    ) -> StudyState:
        attrs = attrs or {}
        state = cls(stopped=attrs.get(STUDY_STOPPED), exhaustive=exhaustive, stop_detail=attrs.get(STUDY_STOP_DETAIL))
        baseline = attrs.get(STUDY_BASELINE)
        for trial in sorted(trials, key=lambda t: t.number):
            kind = trial_kind(trial)
            state.kinds[kind] += 1
            state._note_proposal(trial, kind)
            if kind not in ("ok", "failed"):
                continue
            state.counted.append(trial)
            state.elapsed_s += trial_duration_s(trial)
            if kind == "failed":
                state.failures[trial.user_attrs[ATTR_REASON]] += 1
                state.since_best += 1
                continue
            value = float(trial.value) if trial.value is not None else float("inf")
            if baseline is not None and _unfused(trial.user_attrs.get(ATTR_CONFIG), baseline):
                state.baseline_us = value if state.baseline_us is None else min(state.baseline_us, value)
            if state.best is None or value < float(state.best.value):  # type: ignore[arg-type]
                state.best, state.since_best = trial, 0
            else:
                state.since_best += 1
        state._judge(attrs.get(STUDY_FINAL), baseline)
        return state

    def _judge(self, noted: Any, baseline: str | None) -> None:
        """Take the final round's pick as the best (and its timings over the trials' where it timed a baseline),
        if the round judged exactly these trials."""
        final = FinalRound.from_json(noted) if isinstance(noted, Mapping) else None
        if final is None or final.counted != len(self.counted):
            return
        pick = next((t for t in self.counted if t.user_attrs.get(ATTR_CONFIG) == final.pick), None)
        if pick is None:
            return
        self.final, self.best = final, pick
        if baseline is None:
            return
        for key in final.p50:
            if _unfused(key, baseline):
                ours = final.median(key)
                self.baseline_us = ours if self.baseline_us is None else min(self.baseline_us, ours)

    def _note_proposal(self, trial: FrozenTrial, kind: str) -> None:
        """Count what the space did to the trial's proposal (refused, or moved into the valid space), and its
        prior's source."""
        attrs = trial.user_attrs
        if kind == "invalid":
            why = attrs.get(ATTR_REFUSED) or [str(attrs.get(ATTR_DETAIL, "unknown")).split(":", 1)[0]]
            self.refused.update(why)
        moved = attrs.get(ATTR_MOVED)
        if moved and kind not in ("cached", "skipped", "interrupted"):
            self.moved_trials += 1
            self.moved.update(moved.get("why", ()))
            self.redrawn += int(moved.get("redrawn", 0))
            self.moved_nearest += bool(moved.get("fields"))
        source = attrs.get(ATTR_PRIOR)
        if source and ATTR_RETRY_OF not in attrs:
            self.priors.append(source)

    @property
    def trial_count(self) -> int:
        """The study's trials as every view reports them (the sweep's table, a record's `trials`, so `db
        list`, REST, bundles and the dashboard): configs that ran, measured or failed; invalid suggestions,
        cached repeats and interrupted attempts are not trials. Computed here only."""
        return len(self.counted)

    @property
    def running(self) -> int:
        return self.kinds["running"]

    @property
    def waiting(self) -> int:
        return self.kinds["waiting"]

    @property
    def refused_count(self) -> int:
        """Proposals the space refused: none of them ran or cost a trial."""
        return self.kinds["invalid"]

    @property
    def best_value(self) -> float | None:
        """The best's p50 in µs: the final round's median where one judged the study, else its trial's."""
        if self.final is not None and self.final.pick is not None:
            return self.final.median(self.final.pick)
        return float(self.best.value) if self.best is not None and self.best.value is not None else None

    def finalists(self, *, margin: float, count: int) -> list[str]:
        """The configs (canonical JSON) a final round times again: each measured config within `margin` of the
        fastest trial, fastest first (ties: the earlier trial), at most `count`."""
        first: dict[str, FrozenTrial] = {}
        for trial in self.counted:
            if trial.state == TrialState.COMPLETE and trial.value is not None and ATTR_CONFIG in trial.user_attrs:
                first.setdefault(trial.user_attrs[ATTR_CONFIG], trial)
        ranked = sorted(first.values(), key=lambda t: (float(t.value), t.number))  # type: ignore[arg-type]
        if not ranked:
            return []
        limit = float(ranked[0].value) * (1 + margin)  # type: ignore[arg-type]
        return [t.user_attrs[ATTR_CONFIG] for t in ranked if float(t.value) <= limit][:count]  # type: ignore[arg-type]

    def best_percentiles(self) -> tuple[float | None, float | None, float | None]:
        """(p10, p50, p90) of the best in µs, as `best_value` takes them."""
        if self.final is not None and self.final.pick is not None:
            pick = self.final.pick
            return self.final.median(pick, "p10"), self.final.median(pick), self.final.median(pick, "p90")
        if self.best is None:
            return None, None, None
        return self.best.user_attrs.get(ATTR_P10), self.best_value, self.best.user_attrs.get(ATTR_P90)

    def budget(self, settings: TuneSettings) -> int:
        if self.exhaustive:
            return self.trial_count + self.running + self.waiting
        return settings.trials

    def done(self, settings: TuneSettings) -> str | None:
        """Why the study needs no more trials (None while it does). Patience is judged once the start is
        measured (no enqueued config waits): the start's trials are not the search failing to improve."""
        if self.stopped:
            return self.stopped
        if self.exhaustive:
            return "exhausted" if self.waiting == 0 and self.running == 0 and self.counted else None
        if self.trial_count >= settings.trials:
            return "trials"
        if settings.time_budget_s is not None and self.elapsed_s >= settings.time_budget_s:
            return "time"
        patient = settings.patience is not None and self.best is not None and self.waiting == 0
        if patient and self.since_best >= settings.patience:  # type: ignore[operator]
            return "patience"
        return None

    def explain(self, settings: TuneSettings) -> str | None:
        """Why the study stopped, in a sentence (None while it runs): `done` with its numbers."""
        reason = self.done(settings)
        if reason is None:
            return None
        if reason == "trials":
            return f"used its budget of {settings.trials} trials"
        if reason == "time":
            return f"used its time budget: {self.elapsed_s:.1f} s of trial time of {settings.time_budget_s:g} s"
        if reason == "patience" and self.best is not None:
            return (
                f"patience: {self.since_best} trials since the best (trial {self.best.number}, "
                f"{self.best_value:,.1f} µs) without a faster one (patience {settings.patience})"
            )
        if reason == "exhausted" and self.exhaustive:
            return f"measured every valid config ({self.trial_count})"
        return f"{reason}: {self.stop_detail}" if self.stop_detail else reason

    def proposals_text(self) -> str:
        """How the space treated the proposals: "refused 0 proposals (no trial spent); 12 draws redrawn inside the
        valid space for 5 trials, 1 moved to the nearest valid config (heads_per_program 5, shared memory 1)"."""

        def why(counts: collections.Counter[str]) -> str:
            return " (" + ", ".join(f"{name} {n}" for name, n in counts.most_common()) + ")" if counts else ""

        n = self.refused_count
        text = f"refused {n} proposal{'' if n == 1 else 's'}{why(self.refused)} (no trial spent)"
        if self.moved_trials:
            text += (
                f"; {self.redrawn} sampler draws redrawn inside the valid space for {self.moved_trials} trials, "
                f"{self.moved_nearest} moved to the nearest valid config{why(self.moved)}"
            )
        return text

    def available(self, settings: TuneSettings) -> int:
        """Trials a group may still claim now (running trials of other groups hold their slots)."""
        if self.done(settings):
            return 0
        if self.exhaustive:
            return self.waiting
        return max(0, settings.trials - self.trial_count - self.running)
