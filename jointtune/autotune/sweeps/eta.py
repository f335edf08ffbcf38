"""How long a sweep has left: per job and in total, from the trial times its studies recorded.

A job's remaining time is its trials left times its mean trial time (measured trials only: invalid
suggestions never run) plus the time between trials that the live view observes (asking Optuna,
storage writes), capped by what is left of its time budget (which counts trial time only). A job
nobody has started yet is estimated at its whole time budget where it has one: other shapes' trial
times say little about a larger shape's or another kernel's (a CPU sweep's ETA said 4:48 left at
0:46 from its smallest shapes' trials, and ran 6:32 more), and a job can't run past its budget by
more than a trial. One without a budget borrows the mean trial time of the jobs that have started.
Patience may end a job sooner; the sweep's estimate is the sum over unfinished jobs, divided by the
groups that share them.

Example:
    >>> fmt_duration(75.0), fmt_duration(3725.0), fmt_duration(None)
    ('1:15', '1:02:05', '?')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jointtune.autotune.tuner.results import JobResult


def fmt_duration(seconds: float | None) -> str:
    """`m:ss` or `h:mm:ss`; "?" when unknown."""
    if seconds is None:
        return "?"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


def mean_trial_s(results: Sequence[JobResult]) -> float | None:
    """Mean duration of a measured trial over every job (None before the first one ends)."""
    count = sum(r.counted for r in results)
    return sum(r.state.elapsed_s for r in results) / count if count else None


def trials_left(result: JobResult) -> int:
    """Trials the job may still run (an exhaustive study not opened yet: its whole budget)."""
    if result.done_reason is not None:
        return 0
    budget = result.budget if result.budget > 0 else result.job.settings.trials
    return max(0, budget - result.counted)


def job_eta_s(result: JobResult, *, fallback_trial_s: float | None = None, overhead_s: float = 0.0) -> float | None:
    """Seconds the job has left at most; 0 when done, None when nothing has been timed yet.

    `overhead_s`: wall time per trial spent outside trials (between them).
    """
    left = trials_left(result)
    if left == 0:
        return 0.0
    per_trial = result.state.elapsed_s / result.counted if result.counted else fallback_trial_s
    budget = result.job.settings.time_budget_s
    if not result.counted and budget is not None:  # not started: its budget bounds it, a guess would not
        return budget * ((per_trial + overhead_s) / per_trial if per_trial else 1.0)
    if per_trial is None:
        return None
    eta = left * (per_trial + overhead_s)
    if budget is not None and per_trial > 0:
        eta = min(eta, max(0.0, budget - result.state.elapsed_s) * (per_trial + overhead_s) / per_trial)
    return eta


def sweep_eta_s(results: Sequence[JobResult], *, parallel: int = 1, overhead_s: float = 0.0) -> float | None:
    """Seconds the sweep has left at most, its unfinished jobs shared by `parallel` groups."""
    fallback = mean_trial_s(results)
    return total_eta_s([job_eta_s(r, fallback_trial_s=fallback, overhead_s=overhead_s) for r in results], parallel)


def total_eta_s(etas: Sequence[float | None], parallel: int = 1) -> float | None:
    """Seconds the sweep has left at most, given each job's ETA (None: one job can't tell yet)."""
    if any(e is None for e in etas):
        return None
    return sum(e for e in etas if e is not None) / max(1, parallel)
