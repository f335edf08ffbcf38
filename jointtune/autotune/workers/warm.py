"""Rank processes started before their group is known, so their imports overlap the CLI's own set-up.

A rank process spends its first seconds importing torch, Optuna, SQLAlchemy and the tuner (2 s of a CPU tune's 9 s
on 2 cores, all of it after the CLI's own set-up: its checks, the store, the hardware, the header). `tune` starts as
many processes as it expects ranks right away (`expected_ranks`); each binds to the CLI as a rank does (`lifeline`),
imports those modules (never Triton nor the kernels: whether they run compiled or interpreted is decided later, in
the rank) and waits. A `Supervisor` hands one its group spec, rank and environment (the CLI's, as a spawn would have
given it then) instead of spawning a process; restarts, and ranks beyond the guess, are spawned as before. Processes
nobody took are stopped when the run ends.

Example:
    >>> warm = WarmRanks(2)                        # doctest: +SKIP
    >>> Supervisor(spec, warm=warm).start()        # doctest: +SKIP
    >>> warm.close()                               # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from typing import Any

from jointtune.autotune.workers import phases

#: what a waiting rank imports: what every rank imports before its first trial, and nothing that reads the
#: environment the rank is given later (Triton and the kernels read TRITON_INTERPRET as they load)
PRELOAD = ("torch", "optuna", "sqlalchemy", "jointtune.db", "jointtune.autotune.workers.group")


class WarmRanks:
    """`count` spawned processes waiting to become ranks (see the module docstring); start them from the thread that
    will start the ranks (the CLI's main thread: `lifeline`)."""

    def __init__(self, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._idle: list[tuple[Any, Any]] = []
        for _ in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=warm_entry, args=(theirs,), daemon=False)
            proc.start()
            theirs.close()
            self._idle.append((proc, mine))

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, spec: Any, rank: int, env: dict[str, str]) -> Any | None:
        """A waiting process, now running `rank` of `spec` with `env` over the CLI's environment; None when none is
        left (or the one left died)."""
        while self._idle:
            proc, conn = self._idle.pop(0)
            try:
                conn.send((spec, rank, {**os.environ, **env}))
            except OSError:  # it died waiting: spawn instead
                proc.join(timeout=0)
                continue
            conn.close()
            return proc
        return None

    def close(self) -> None:
        """Stop the processes nobody took."""
        for proc, conn in self._idle:
            conn.close()
            proc.terminate()
        for proc, _ in self._idle:
            proc.join()
        self._idle.clear()


def warm_entry(conn: Any) -> None:
    """Target of a waiting rank: bind to the CLI, import, wait for a rank to run (or exit when none comes)."""
    from jointtune.autotune.workers.group import bound_entry
    from jointtune.autotune.workers.lifeline import bind_to_parent

    bind_to_parent()  # first, as a rank: it never outlives the CLI
    for module in PRELOAD:
        importlib.import_module(module)
    ready = time.time()
    try:
        message = conn.recv()
    except (EOFError, OSError):
        message = None
    conn.close()
    if message is None:
        os._exit(0)
    spec, rank, env = message
    phases.set_who(f"rank{rank}")
    started = phases.process_start()
    if started is not None:
        phases.record("preload", started, ready)
    phases.record("wait", ready)
    bound_entry(spec, rank, env)


def expected_ranks(*, world_size: int, groups: int | None) -> int:
    """How many rank processes a one-job tune on this node starts, guessed without importing torch: on GPUs
    (device files present and CUDA_VISIBLE_DEVICES, if set, naming some) `world_size` per group, as many groups as
    fit the visible GPUs; on a CPU one process per group. A wrong guess costs idle processes or cold starts, never
    a different run."""
    from jointtune.hardware import gpu_device_present

    if not gpu_device_present():
        return groups or 1
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = len([d for d in visible.split(",") if d.strip()])
    else:
        gpus = len([name for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit()])
    if gpus < world_size:
        return 0
    return world_size * min(groups or gpus // world_size, gpus // world_size)
