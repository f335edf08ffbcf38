"""Running a sweep on this node: plan the groups, supervise them, show progress, report.

On a GPU node a group is one process per GPU of the job's world size (NCCL for the kernels, gloo
for control), and the node runs `GPUs // world_size` groups side by side; jobs of another world
size run in a later phase. On a CPU a group is one process driving a local world of W simulated
ranks (Triton's interpreter), so one group serves every world size; `groups` runs several.
Groups of one sweep share its studies, so more groups simply finish sooner.

Example:
    >>> results = run_jobs(jobs, url="sqlite:////tmp/jt.db")      # doctest: +SKIP
    >>> any(r.failed_entirely for r in results)                    # doctest: +SKIP
    False
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console

from jointtune.autotune.tuner.results import JobResult, collect
from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.workers import phases as phase_log
from jointtune.autotune.workers.coordinator import GroupOptions
from jointtune.autotune.workers.group import GroupSpec
from jointtune.autotune.workers.recovery import host_id
from jointtune.autotune.workers.supervisor import Supervisor
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.workers.warm import WarmRanks


def prepare_interpreter() -> bool:
    """Choose Triton's interpreter when no GPU is visible (before any kernel module is imported).

    Returns True when this node tunes on GPUs.
    """
    import torch

    if torch.cuda.is_available():
        return True
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return False


@dataclass(frozen=True)
class Phase:
    """Groups that run at the same time: their specs share one world size (or a local world)."""

    world_size: int | None
    specs: tuple[GroupSpec, ...]


def plan_groups(
    jobs: Sequence[Job],
    *,
    url: str,
    imports: Sequence[str] = (),
    groups: int | None = None,
    gpus: int = 0,
    options: GroupOptions = GroupOptions(),
    sweep: str | None = None,
    profile: str | None = None,
) -> list[Phase]:
    """The groups to run for `jobs` on a node with `gpus` GPUs (0: the CPU interpreter)."""
    run = uuid.uuid4().hex[:8]
    base = GroupSpec(url=url, group_id="", imports=tuple(imports), options=options, sweep=sweep, profile=profile)
    explicit = () if sweep else tuple(jobs)
    if gpus == 0:
        specs = tuple(
            dataclasses.replace(base, group_id=f"{host_id()}:{run}:cpu{g}", jobs=explicit) for g in range(groups or 1)
        )
        return [Phase(None, specs)]
    phases = []
    for w in dict.fromkeys(job.world_size for job in jobs):
        if w > gpus:
            raise TuningError(f"world_size: {w} is not allowed on this node; it has {gpus} GPU(s)")
        specs = tuple(
            dataclasses.replace(
                base,
                group_id=f"{host_id()}:{run}:w{w}g{g}",
                jobs=tuple(j for j in explicit if j.world_size == w),
                world_kind="cuda",
                nprocs=w,
                device_offset=g * w,
            )
            for g in range(min(groups or gpus // w, gpus // w))
        )
        phases.append(Phase(w, specs))
    return phases


def run_phases(
    phases: Sequence[Phase],
    *,
    on_tick: Callable[[], object] | None = None,
    tick_s: float = 1.0,
    poll_s: float = 0.2,
    warm: WarmRanks | None = None,
) -> None:
    """Run each phase's groups to completion, one phase after another; `on_tick` every `tick_s`. `warm`: processes
    started earlier that take ranks first."""
    last = 0.0
    for phase in phases:
        sups = [Supervisor(spec, warm=warm) for spec in phase.specs]
        try:
            for sup in sups:
                sup.start()
            while not all([sup.poll() for sup in sups]):
                if on_tick is not None and time.monotonic() - last >= tick_s:
                    on_tick()
                    last = time.monotonic()
                time.sleep(poll_s)
        finally:
            for sup in sups:
                sup.stop()


def run_jobs(
    jobs: Sequence[Job],
    *,
    url: str | None = None,
    imports: Sequence[str] = (),
    groups: int | None = None,
    console: Console | None = None,
    options: GroupOptions = GroupOptions(),
    sweep: str | None = None,
    profile: str | None = None,
    title: str = "tuning",
    on_start: Callable[[Sequence[JobResult], int], object] | None = None,
    warm: WarmRanks | None = None,
) -> list[JobResult]:
    """Tune `jobs` on this node with live progress; returns every job's final standing.

    `on_start(results, groups)` sees where the jobs stood before anything ran (a re-run finds some
    already tuned) and how many groups will share them, before any group starts. When every job
    is done already, no group is started at all. `warm`: rank processes started earlier (`warm`), which take
    the first ranks; the caller stops those left.
    """
    from jointtune.autotune.tuner.studies import open_storage
    from jointtune.autotune.workers.sweeps.progress import ProgressView
    from jointtune.db import is_memory_sqlite, open_store, resolve_db_url
    from jointtune.hardware import detect

    on_gpu = prepare_interpreter()
    url = resolve_db_url(url)
    if is_memory_sqlite(url):
        raise TuningError(f"database URL: {url!r} is not allowed; rank processes can't share an in-memory database")
    open_store(url)  # migrate the store before any group opens Optuna's tables beside it
    storage = open_storage(url)
    phase_log.lap("storage")
    hardware_id = detect().hardware_id
    gpus = _gpu_count() if on_gpu else 0
    phases = plan_groups(
        jobs, url=url, imports=imports, groups=groups, gpus=gpus, options=options, sweep=sweep, profile=profile
    )
    console = console or Console()
    read = lambda: collect(storage, jobs, hardware_id=hardware_id)
    before = read()
    phase_log.lap("studies")
    parallel = len(phases[0].specs) if phases else 1
    if on_start is not None:
        on_start(before, parallel)
    if all(r.done_reason is not None for r in before):
        return list(before)
    already = [r.study_name for r in before if r.done_reason is not None]
    phase_log.lap("header")
    phase_log.record("prepare", phase_log.entered())
    with ProgressView(console, read, title=title, parallel=parallel, already=already) as view:
        with phase_log.phase("ranks"):
            run_phases(phases, on_tick=view.refresh, warm=warm)
        view.refresh()
    return list(read())


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()
