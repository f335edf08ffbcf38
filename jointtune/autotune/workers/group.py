"""A rank process of a tuning group: set up, then coordinate (rank 0) or follow (the others).

The same function serves every launcher: our supervisor (one process per GPU, or one process
driving a local world of W simulated ranks on a CPU), torchrun (`jointtune worker` under
`torchrun --nproc-per-node=<GPUs>`), and tests. It returns an exit code: 0 when no work is left,
`EXIT_RESTART` when the group must be restarted (a crashed trial or a dead peer).

Example:
    >>> spec = GroupSpec(url="sqlite:////tmp/jt.db", group_id="g0", jobs=(job,))   # doctest: +SKIP
    >>> run_rank(spec, rank=0)                                                     # doctest: +SKIP
    0
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.workers import phases
from jointtune.autotune.workers.coordinator import GroupInfo, GroupOptions, GroupRestart
from jointtune.autotune.workers.lifeline import bind_to_parent
from jointtune.autotune.workers.watchdog import EXIT_RESTART

if TYPE_CHECKING:
    from jointtune.autotune.workers.compiler import CompilePool
    from jointtune.autotune.workers.control import Control
    from jointtune.autotune.workers.executor import RankExecutor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupSpec:
    """Everything a rank process needs (picklable: it crosses the spawn boundary).

    Jobs come either explicitly (`jobs`) or from a sweep registered in the storage (`sweep`,
    filtered to `profile`). `device_offset` is the first GPU of this group on its node.
    `precompile_workers`: per rank, compile processes on GPUs (None: $JOINTTUNE_COMPILE_WORKERS, else none: threads),
    threads on a local world (None: 2); 0 compiles each config at its trial.
    """

    url: str
    group_id: str
    jobs: tuple[Job, ...] = ()
    sweep: str | None = None
    profile: str | None = None
    world_kind: str = "local"
    nprocs: int = 1
    imports: tuple[str, ...] = ()
    options: GroupOptions = field(default_factory=GroupOptions)
    device_offset: int = 0
    precompile_workers: int | None = None


def device_profile() -> str:
    """'gpu' when this process sees CUDA, else 'cpu'."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def _prepare_process(spec: GroupSpec) -> None:
    # Triton reads TRITON_INTERPRET when kernels are defined: choose before any family import.
    import torch

    if spec.world_kind == "local" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # One intra-op thread, as torchrun sets: on a shared CPU a thread of a timed op that waits
        # for a preempted sibling turns microseconds into a scheduler slice.
        torch.set_num_threads(1)
    for module in spec.imports:
        importlib.import_module(module)


def _jobs_source(spec: GroupSpec) -> Any:
    if spec.sweep is None:
        return lambda: spec.jobs
    from jointtune.autotune.tuner.studies import open_storage
    from jointtune.autotune.workers.sweeps.registry import load_sweep

    storage = open_storage(spec.url)
    profile = spec.profile or device_profile()
    return lambda: load_sweep(storage, spec.sweep).jobs(profile)


def _compile_pool(spec: GroupSpec) -> CompilePool | None:
    """A rank on GPUs may compile ahead in worker processes, started now, so their imports overlap this rank's set-up:
    $JOINTTUNE_COMPILE_WORKERS=N (or `precompile_workers`) starts N per rank ("auto": the node's CPUs shared by as many
    ranks as it has GPUs). Off by default: on 4x H100 (Triton 3.6, bench/README.md, "The cold tune on GPUs") the ranks
    still compiled every config the pool had built and a cold tune took 7 s longer than with the threads. Since the
    fix for that (Triton 3.6 keyed a kernel by which kernel its process hashed first: `kernels.runtime.cache_keys`) the
    ranks find the pool's entries, and on 4x H200 a cold 24-trial tune took 24.9 s with the pool and 24.5 s without:
    no gain to turn it on for. Without a pool the claimed configs compile on threads."""
    import torch

    from jointtune.autotune.workers.compiler import CompilePool, default_workers

    if spec.world_kind != "cuda":
        return None
    workers = spec.precompile_workers
    text = os.environ.get("JOINTTUNE_COMPILE_WORKERS", "").strip().lower()
    if workers is None and text.isdigit():
        workers = int(text)
    if workers is None and text == "auto":
        workers = default_workers(max(spec.nprocs, torch.cuda.device_count()))
    if workers is None or workers < 1:
        return None
    return CompilePool(workers, imports=spec.imports, warm_driver=True)


def run_rank(spec: GroupSpec, rank: int | None = None) -> int:
    """Run this process's rank of the group until no work is left; returns the exit code."""
    if rank is not None:
        os.environ["RANK"] = str(rank)
    os.environ.setdefault("WORLD_SIZE", str(spec.nprocs))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    phases.set_who(f"rank{os.environ['RANK']}" if "RANK" in os.environ else "rank")
    phases.record_start()
    with phases.phase("imports"):
        _prepare_process(spec)
    pool = _compile_pool(spec)
    try:
        return _run_group(spec, local_rank, pool)
    finally:
        if pool is not None:
            pool.close()


def _run_group(spec: GroupSpec, local_rank: int, pool: CompilePool | None) -> int:
    from jointtune.autotune.workers.control import init_control
    from jointtune.autotune.workers.executor import RankExecutor

    use_cuda = spec.world_kind == "cuda"
    with phases.phase("control"):
        control = init_control(use_cuda=use_cuda, device_index=spec.device_offset + local_rank)
    threads = 2 if spec.precompile_workers is None else spec.precompile_workers  # where there is no pool
    executor = RankExecutor(control, world_kind=spec.world_kind, precompile_workers=threads, compiler=pool)
    try:
        if control.rank == 0:
            from jointtune.autotune.workers.coordinator import Coordinator

            info = GroupInfo(spec.group_id, spec.world_kind, control.size)
            Coordinator(
                url=spec.url,
                jobs=_jobs_source(spec),
                group=info,
                control=control,
                executor=executor,
                options=spec.options,
            ).run()
        else:
            follow(control, executor)
        done = time.time()
    except GroupRestart as exc:
        log.error("group %s restarts: %s", spec.group_id, exc)
        return EXIT_RESTART
    except RuntimeError as exc:
        if control.size > 1 and _peer_gone(exc):
            log.error("group %s lost a peer: %s", spec.group_id, exc)
            return EXIT_RESTART
        raise
    finally:
        executor.close()
    control.close()
    phases.record("done", done)  # no work left (a point)
    phases.record("teardown", done)  # the executor and the process groups closed
    return 0


def _peer_gone(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(m in text for m in ("connection closed", "connection reset", "broken pipe", "peer", "gloo"))


def follow(control: Control, executor: RankExecutor) -> None:
    """Ranks > 0: do what rank 0 broadcasts until it says stop."""
    while True:
        command = control.broadcast(None)
        op = command["op"]
        if op == "stop":
            return
        if op == "study":
            executor.start_study(Job.from_json(command["job"]))
        elif op == "trial":
            executor.prefetch([command["config"], *command["upcoming"]], command.get("queued", ()))
            outcome = executor.execute(command["config"], deadline_s=command["deadline_s"])
            if outcome.fatal:
                raise GroupRestart(f"trial crashed: {outcome.detail}")


def process_entry(spec: GroupSpec, rank: int, env: dict[str, str]) -> None:
    """Target of a spawned rank process: bind to the parent, apply the group's environment, run, exit with the code."""
    bind_to_parent()  # first, before it starts anything: it never outlives the CLI (see lifeline)
    bound_entry(spec, rank, env)


def bound_entry(spec: GroupSpec, rank: int, env: dict[str, str]) -> None:
    """A rank process bound to its parent: apply the group's environment, run, exit with the code."""
    os.environ.update(env)
    logging.basicConfig(level=os.environ.get("JOINTTUNE_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    try:
        code = run_rank(spec, rank)
    except BaseException:
        logging.getLogger(__name__).exception("rank %d of group %s failed", rank, spec.group_id)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # don't wait for precompile threads or process-group teardown
