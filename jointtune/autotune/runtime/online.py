"""Online tuning of one key from inside a running job, with the tuner's own coordinator.

What to tune and on which ranks is decided here; the workers run it (`jointtune.autotune.workers.online`, their
one entry point). The budget is small on purpose (`ONLINE_SETTINGS`): a job that tunes on a miss should wait
seconds, not hours; offline sweeps are where the long studies belong.

Example:
    >>> tune_online("ag_gemm", problem, db_url="sqlite:////tmp/jt.db")          # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jointtune.autotune.tuner.settings import Job, TuneSettings

if TYPE_CHECKING:
    from jointtune.search_spaces import Problem

#: the default budget of tuning on a miss: 8 trials, short benchmarks
ONLINE_SETTINGS = TuneSettings(trials=8, warmup=1, iters=5, warm_start=3, lookahead=0)


def tune_online(kernel: str, problem: Problem, *, db_url: str, settings: TuneSettings | None = None) -> None:
    """Tune `kernel` for `problem` on every rank of this job; the best lands in the store at `db_url`.

    Collective in a distributed job: every rank must call it for the same key at the same point.
    """
    from jointtune.autotune.runtime import agreement
    from jointtune.autotune.workers.online import tune_job

    group = agreement.control_group() if agreement.distributed() else None
    tune_job(Job.of(kernel, problem, settings or ONLINE_SETTINGS), db_url=db_url, group=group)
