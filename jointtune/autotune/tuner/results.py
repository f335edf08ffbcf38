"""Where each job of a sweep stands, read back from the storage: for progress, summaries, plots.

Every number here is derived from the job's study (see `studies`), so the same table comes out
of a live sweep, a finished one, or a worker on another node.

Example:
    >>> results = collect(storage, jobs, hardware_id="cpu-interpreter-x1-none-1a2b3c4d")   # doctest: +SKIP
    >>> [(r.job.label, r.best_us, r.speedup) for r in results]                            # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna

from jointtune.autotune.tuner.keys import TuningKey
from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.tuner.studies import (
    ATTR_HOST,
    ATTR_RETRY_OF,
    ATTR_ROLE,
    StudyState,
    trial_config,
    trial_kind,
)
from jointtune.timings import measured_as

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


def study_name_for(job: Job, hardware_id: str) -> str:
    """The study a group on `hardware_id` uses for `job` (what the coordinator derives)."""
    from jointtune.autotune.tuner.handles import study_space
    from jointtune.kernels import get_family

    family = get_family(job.kernel)
    space = study_space(family, job.settings)
    key = TuningKey.of(family.name, family.version, job.problem, hardware_id, job.settings.timing)
    return key.study_name(space_version=space.version, exhaustive=job.settings.strategy == "exhaustive")


def shape_label(job: Job) -> str:
    """Dims in the family's order ("M=64,N=128,K=64"); sorted by name for unknown families."""
    from jointtune.kernels import get_family

    shape = dict(job.shape)
    try:
        order = [d for d in get_family(job.kernel).dims if d in shape]
    except KeyError:
        order = []
    order += [d for d in sorted(shape) if d not in order]
    return ",".join(f"{d}={shape[d]}" for d in order)


def _param_order(kernel: str) -> dict[str, int]:
    from jointtune.autotune.tuner.handles import resolve_space
    from jointtune.kernels import get_family

    try:
        return {p.name: i for i, p in enumerate(resolve_space(get_family(kernel)).params)}
    except KeyError:
        return {}


def job_label(job: Job) -> str:
    timing = "" if job.settings.timing == "gpu" else f" ({job.settings.timing} timing)"
    return f"{job.kernel} {shape_label(job)} {job.dtype} w{job.world_size}{timing}"


@dataclass
class JobResult:
    """One job's standing: budget use, failures by reason, best and baseline latency."""

    job: Job
    study_name: str
    trials: list[FrozenTrial] = field(default_factory=list)
    state: StudyState = field(default_factory=StudyState)
    #: where it is tuned: its measurements are interp on the CPU interpreter, whatever the job asked
    hardware_id: str = ""

    @property
    def timing(self) -> str:
        """The timing policy its study measures (and its record says): `measured_as` the job's."""
        return measured_as(self.job.settings.timing, self.hardware_id)

    @property
    def counted(self) -> int:
        """Its trials: `StudyState.trial_count`, the number its record reports too."""
        return self.state.trial_count

    @property
    def budget(self) -> int:
        return self.state.budget(self.job.settings) if self.state.exhaustive else self.job.settings.trials

    @property
    def done_reason(self) -> str | None:
        return self.state.done(self.job.settings) if self.trials else None

    @property
    def best_us(self) -> float | None:
        return self.state.best_value

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The best config, fields in the space's order (mode first, then its knobs)."""
        if self.state.best is None:
            return None
        config = trial_config(self.state.best)
        order = _param_order(self.job.kernel)
        return {k: config[k] for k in sorted(config, key=lambda k: order.get(k, len(order)))}

    @property
    def baseline_us(self) -> float | None:
        return self.state.baseline_us

    @property
    def speedup(self) -> float | None:
        if self.best_us and self.baseline_us:
            return self.baseline_us / self.best_us
        return None

    @property
    def failed_entirely(self) -> bool:
        """Finished without a single measured config (a shape the sweep could not tune)."""
        return self.done_reason is not None and self.best_us is None

    def curve(self) -> list[tuple[int, float | None, str | None]]:
        """(trial index, p50 µs or None, failure reason or None) for each counted trial, in order."""
        out = []
        for i, trial in enumerate(self.state.counted):
            if trial_kind(trial) == "ok":
                out.append((i, float(trial.value), None))  # type: ignore[arg-type]
            else:
                out.append((i, None, trial.user_attrs.get("fail_reason")))
        return out

    @property
    def stop_text(self) -> str | None:
        """Why it stopped, in a sentence (`StudyState.explain`); None while it runs."""
        return self.state.explain(self.job.settings) if self.trials else None

    def start_roles(self) -> dict[str, int]:
        """How many configs of each role its start held (baseline, default, warm, seed, mode, grid)."""
        roles: dict[str, int] = {}
        for trial in self.trials:
            role = trial.user_attrs.get(ATTR_ROLE)
            if role is not None and ATTR_RETRY_OF not in trial.user_attrs:
                roles[role] = roles.get(role, 0) + 1
        return roles

    def summary_line(self) -> str:
        """One line for a closing summary: why it stopped, what the space refused, which warm starts it took."""
        priors: dict[str, int] = {}
        for source in self.state.priors:
            priors[source.get("kind", "?")] = priors.get(source.get("kind", "?"), 0) + 1
        warm = ", ".join(f"{kind} {n}" for kind, n in priors.items())
        parts = [self.stop_text or "running", self.state.proposals_text()]
        if self.state.final is not None:
            parts.append(self.state.final.summary())
        parts.append(f"warm starts: {len(self.state.priors)} ({warm})" if priors else "warm starts: none in the store")
        return f"{job_label(self.job)} — " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        best = self.state.best
        state = self.state
        p10, _, p90 = state.best_percentiles()
        return {
            "job": self.job.to_json(),
            "study": self.study_name,
            "timing": self.timing,
            "trials": self.counted,
            "budget": self.budget,
            "status": self.done_reason or "running",
            "failures": dict(self.state.failures),
            "best_us": self.best_us,
            "best_p10_us": p10,
            "best_p90_us": p90,
            "best_host_us": best.user_attrs.get(ATTR_HOST) if best else None,
            "baseline_us": self.baseline_us,
            "speedup": self.speedup,
            "best_config": self.best_config,
            "stop": self.stop_text,
            "start": self.start_roles(),
            "warm_starts": state.priors,
            "final_round": state.final.to_json() if state.final is not None else None,
            "proposals": {
                "refused": state.refused_count,
                "refused_why": dict(state.refused),
                "moved_trials": state.moved_trials,
                "redrawn_draws": state.redrawn,
                "moved_to_nearest": state.moved_nearest,
                "moved_why": dict(state.moved),
            },
        }


def collect(storage: optuna.storages.BaseStorage, jobs: Sequence[Job], *, hardware_id: str) -> list[JobResult]:
    """A JobResult per job (empty ones for studies no group has opened yet)."""
    names = {s.study_name: s for s in storage.get_all_studies()}
    results = []
    for job in jobs:
        name = study_name_for(job, hardware_id)
        result = JobResult(job, name, hardware_id=hardware_id)
        summary = names.get(name)
        if summary is not None:
            result.trials = storage.get_all_trials(summary._study_id, deepcopy=False)
            result.state = StudyState.of(
                result.trials, attrs=summary.user_attrs, exhaustive=job.settings.strategy == "exhaustive"
            )
        else:
            result.state = StudyState(exhaustive=job.settings.strategy == "exhaustive")
        results.append(result)
    return results
