"""How long a sweep has left: per job and in total, from the trial times its studies recorded.

A job's remaining time is its trials left times its mean trial time (measured trials only: invalid
suggestions never run) plus the time between trials that the live view observes (asking Optuna,
storage writes), capped by what is left of its time budget (which counts trial time only). A job
nobody has started yet borrows the mean trial time of the started jobs of its kernel, capped by its
budget; where no job of its kernel has started, it counts at its whole time budget (another kernel's
trial times say little about its own: a CPU sweep's ETA said 4:48 left at 0:46 from its first kernel's
trials and ran 6:32 more), and only without a budget at the mean trial time of all started jobs.
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


def mean_trial_s(results: Sequence[JobResult], kernel: str | None = None) -> float | None:
    """Mean duration of a measured trial over every job (or `kernel`'s jobs); None before the first one ends."""
    mine = [r for r in results if kernel is None or r.job.kernel == kernel]
    count = sum(r.counted for r in mine)
    return sum(r.state.elapsed_s for r in mine) / count if count else None


def trials_left(result: JobResult) -> int:
    """Trials the job may still run (an exhaustive study not opened yet: its whole budget)."""
    if result.done_reason is not None:
        return 0
    budget = result.budget if result.budget > 0 else result.job.settings.trials
    return max(0, budget - result.counted)


def job_eta_s(
    result: JobResult,
    *,
    fallback_trial_s: float | None = None,
    overhead_s: float = 0.0,
    kernel_trial_s: float | None = None,
) -> float | None:
    """Seconds the job has left; 0 when done, None when nothing has been timed yet.

    `overhead_s`: wall time per trial spent outside trials (between them). `fallback_trial_s` and
    `kernel_trial_s`: the mean trial time of every started job, and of the started jobs of this one's kernel.
    """
    left = trials_left(result)
    if left == 0:
        return 0.0
    budget = result.job.settings.time_budget_s
    if result.counted:
        per_trial = result.state.elapsed_s / result.counted
    elif kernel_trial_s is not None:
        per_trial = kernel_trial_s
    elif budget is not None:  # not started, nothing like it timed: its budget bounds it, a guess would not
        return budget * ((fallback_trial_s + overhead_s) / fallback_trial_s if fallback_trial_s else 1.0)
    else:
        per_trial = fallback_trial_s
    if per_trial is None:
        return None
    eta = left * (per_trial + overhead_s)
    if budget is not None and per_trial > 0:
        eta = min(eta, max(0.0, budget - result.state.elapsed_s) * (per_trial + overhead_s) / per_trial)
    return eta


def sweep_eta_s(results: Sequence[JobResult], *, parallel: int = 1, overhead_s: float = 0.0) -> float | None:
    """Seconds the sweep has left at most, its unfinished jobs shared by `parallel` groups."""
    return total_eta_s(job_etas(results, overhead_s=overhead_s), parallel)


def job_etas(results: Sequence[JobResult], *, overhead_s: float = 0.0) -> list[float | None]:
    """Every job's `job_eta_s`, each given the mean trial times it borrows from the others."""
    fallback = mean_trial_s(results)
    kernels = {kernel: mean_trial_s(results, kernel) for kernel in {r.job.kernel for r in results}}
    return [
        job_eta_s(r, fallback_trial_s=fallback, overhead_s=overhead_s, kernel_trial_s=kernels[r.job.kernel])
        for r in results
    ]


def total_eta_s(etas: Sequence[float | None], parallel: int = 1) -> float | None:
    """Seconds the sweep has left at most, given each job's ETA (None: one job can't tell yet)."""
    if any(e is None for e in etas):
        return None
    return sum(e for e in etas if e is not None) / max(1, parallel)
