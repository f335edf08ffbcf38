"""Tuning one key from inside a running job: the one entry point the run-time path has into the workers.

Every rank of the job takes part: rank 0 runs the `Coordinator` (Optuna study in the store's database, best
config published to the store), the other ranks follow its broadcasts, exactly as in a `jointtune tune` group.
Outside a distributed job one process tunes on a local world. `jointtune.autotune.runtime.online` decides the
job (its small budget) and the ranks' control group; this module runs it.

Example:
    >>> tune_job(Job.of("ag_gemm", problem, settings), db_url="sqlite:////tmp/jt.db", group=None)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import Job


def tune_job(job: Job, *, db_url: str, group: Any | None) -> None:
    """Tune `job` on every rank of the control `group` (a gloo group of the job's ranks; None: this process alone, on
    a local world); the best config lands in the store at `db_url`.

    Collective where `group` is given: every rank must call it for the same job at the same point.
    """
    import torch

    from jointtune.autotune.workers.control import GlooControl, SoloControl
    from jointtune.autotune.workers.coordinator import Coordinator, GroupInfo, GroupOptions
    from jointtune.autotune.workers.executor import RankExecutor
    from jointtune.autotune.workers.group import follow

    if group is not None:
        import torch.distributed as dist

        control = GlooControl(group)
        cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
        kind, nprocs = ("cuda" if cuda else "local"), control.size
    else:
        control, kind, nprocs = SoloControl(), "local", 1
    # the group id names who owns the study's trials; it need not survive this process
    group_id = control.broadcast(f"decorator-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    executor = RankExecutor(control, world_kind=kind)
    # In the interpreter, one intra-op thread while this call tunes, as tuning groups run: on busy cores a second
    # thread turned 1 baseline call in 100 into a scheduler slice (39 us -> 4 ms), which eager timing then read as
    # the baseline. The caller's setting comes back when the study ends.
    threads = torch.get_num_threads()
    single = kind == "local" and not torch.cuda.is_available() and threads > 1
    if single:
        torch.set_num_threads(1)
    try:
        if control.rank == 0:
            try:
                Coordinator(
                    url=db_url,
                    jobs=lambda: [job],
                    group=GroupInfo(group_id, kind, nprocs),
                    control=control,
                    executor=executor,
                    options=GroupOptions(heartbeat_s=2, grace_s=10, poll_s=0.1),
                ).run()
            except BaseException:
                if nprocs > 1:
                    control.broadcast({"op": "stop"})  # release the followers before raising
                raise
        else:
            follow(control, executor)
    finally:
        executor.close()
        if single:
            torch.set_num_threads(threads)
