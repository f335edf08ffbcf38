"""Keeps one tuning group alive: spawns its rank processes and restarts the group when one dies.

A hung trial ends its processes through the watchdog and a crashing config kills its process;
either way the supervisor sees a rank exit non-zero, ends the rest of the group (a collective
with a dead peer would never return), and starts the group again under the same group id, so the
new rank 0 can record the dead trial as "timeout" or "crash" and go on. A group that keeps dying
without finishing a single trial is given up with a TuningError naming its last exit codes.

Ranks are spawned (never forked: CUDA and threads don't survive a fork) with MASTER_ADDR
127.0.0.1 and a fresh free port per start, one GPU per rank from `spec.device_offset` on.
Each rank binds itself to this process (`lifeline`): if it dies without stopping them (kill -9,
the OOM killer), its ranks and whatever they started die with it.

Example:
    >>> sup = Supervisor(spec)                                                  # doctest: +SKIP
    >>> sup.start()                                                             # doctest: +SKIP
    >>> while not sup.poll(): time.sleep(0.2)                                   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jointtune.autotune.workers.group import GroupSpec, process_entry
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.workers.warm import WarmRanks

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def finished_trials(url: str) -> int:
    """Finished trials in the whole storage: the default measure of a group's progress."""
    from optuna.trial import TrialState

    from jointtune.autotune.tuner.studies import open_storage

    storage = open_storage(url)
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return sum(len(storage.get_all_trials(s._study_id, deepcopy=False, states=done)) for s in storage.get_all_studies())


def _describe(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Runs `spec.nprocs` rank processes of one group until they all exit 0."""

    def __init__(
        self,
        spec: GroupSpec,
        *,
        progress: Callable[[], int] | None = None,
        max_idle_restarts: int = 3,
        start_method: str = "spawn",
        env: dict[str, str] | None = None,
        warm: WarmRanks | None = None,
    ) -> None:
        """`warm`: processes started earlier that take this group's ranks first (`warm`), instead of spawning."""
        self.spec = spec
        self.warm = warm
        self.progress = progress or functools.partial(finished_trials, spec.url)
        self.max_idle_restarts = max_idle_restarts
        self.env = dict(env or {})
        self._ctx = multiprocessing.get_context(start_method)
        self._procs: list[Any] = []
        self.restarts = 0
        self._idle_restarts = 0
        self._last_progress: int | None = None
        self._last_death: float | None = None
        self.done = False

    def start(self) -> None:
        """Spawn the group's rank processes.

        Call it from a thread that outlives them (the main thread): on Linux a rank dies when the
        *thread* that started it exits (`lifeline`).
        """
        port = str(free_port())
        self._last_progress = self.progress()
        self._procs = []
        for rank in range(self.spec.nprocs):
            env = {
                **self.env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(self.spec.nprocs),
                "JOINTTUNE_GROUP_ID": self.spec.group_id,
                "JOINTTUNE_RESTART_COUNT": str(self.restarts),
            }
            if self._last_death is not None:
                env["JOINTTUNE_LAST_DEATH"] = repr(self._last_death)
            proc = self.warm.take(self.spec, rank, env) if self.warm is not None else None
            if proc is None:
                proc = self._ctx.Process(target=process_entry, args=(self.spec, rank, env), daemon=False)
                proc.start()
            self._procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def poll(self) -> bool:
        """True once the group finished; restarts it when a rank died. Call it often."""
        if self.done:
            return True
        codes = [p.exitcode for p in self._procs]
        if all(code == 0 for code in codes):
            self.done = True
            return True
        if not any(code not in (None, 0) for code in codes):
            return False
        self._last_death = time.time()
        summary = ", ".join(f"rank {r}: {_describe(c)}" for r, c in enumerate(codes))
        self.stop()
        if self.progress() != self._last_progress:
            self._idle_restarts = 0
        else:
            self._idle_restarts += 1
        if self._idle_restarts > self.max_idle_restarts:
            raise TuningError(
                f"group {self.spec.group_id}: restarted {self.max_idle_restarts} times without finishing "
                f"a trial; last exit: {summary}"
            )
        log.warning("group %s died (%s); restarting it", self.spec.group_id, summary)
        self.restarts += 1
        self.start()
        return False

    def stop(self, grace_s: float = 2.0) -> None:
        """End every rank process still running (TERM, then KILL after `grace_s`)."""
        for proc in self._procs:
            if proc.exitcode is None:
                proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()

    def wait(self, poll_s: float = 0.2) -> None:
        while not self.poll():
            time.sleep(poll_s)
