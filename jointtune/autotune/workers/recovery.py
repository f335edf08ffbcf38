"""Who owns a running trial, and what happens to it when its owner is gone.

Rank 0 of a group stamps every trial it claims with its owner (host, pid, process start time,
group id) and, when the trial starts executing, with its deadline. A trial whose owner died is
resolved by whoever notices first:

- its own group, restarted by a supervisor (same group id): the death was the config's doing, so
  the trial is a result: "timeout" if its deadline had passed, else "crash";
- anyone else (another group, or a fresh run of a killed sweep): the trial was interrupted, not
  answered; it becomes FAIL and its params are enqueued again (`retry_interrupted`).

Owners on this host are checked through /proc at once; owners on other hosts go stale through
Optuna's heartbeats (`fail_stale_trials`, after the storage's grace period).

Example:
    >>> me = Owner.current("group-1")
    >>> me.alive()
    True
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from jointtune.autotune.tuner.studies import (
    ATTR_DEADLINE,
    ATTR_DETAIL,
    ATTR_OWNER,
    ATTR_REASON,
    quiet_optuna,
    retry_interrupted,
)

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """Hostname plus boot id: two containers that share a hostname still differ."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()[:8]
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}/{boot}"


def _proc_start(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, None if it doesn't exist."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


@dataclass(frozen=True)
class Owner:
    """The process that claimed a trial (rank 0 of a group)."""

    host: str
    pid: int
    start: int | None
    group: str

    @classmethod
    def current(cls, group: str) -> Owner:
        try:
            info = _proc_start(os.getpid())
        except OSError:
            info = None
        return cls(host_id(), os.getpid(), info[1] if info else None, group)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Owner | None:
        if not isinstance(data, Mapping):
            return None
        return cls(str(data.get("host")), int(data.get("pid", 0)), data.get("start"), str(data.get("group")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def alive(self) -> bool:
        """False only when this owner runs on this host and is certainly gone (dead or a zombie)."""
        if self.host != host_id():
            return True
        try:
            info = _proc_start(self.pid)
        except OSError:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        if info is None or info[0] in ("Z", "X"):
            return False
        return self.start is None or info[1] == self.start


def _orphaned(trial: optuna.trial.FrozenTrial, unowned_after_s: float) -> bool:
    # A claimer that died between Optuna's ask and stamping its owner left no heartbeat either.
    started = trial.datetime_start
    return started is not None and (datetime.datetime.now() - started).total_seconds() > unowned_after_s


def recover_study(
    study: optuna.Study, *, group: str, unowned_after_s: float = 60.0, death_time: float | None = None
) -> list[tuple[int, str]]:
    """Resolve this study's running trials whose owner is gone; returns (trial number, outcome).

    `death_time` is when this group's previous incarnation died, as its supervisor saw it; a
    trial it was running timed out if that was past the trial's deadline, else it crashed.
    Without it (torchrun restarts) the time of recovery stands in, which is late by the restart.
    """
    resolved: list[tuple[int, str]] = []
    storage = study._storage
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = Owner.from_json(trial.user_attrs.get(ATTR_OWNER))
        if owner is None and not _orphaned(trial, unowned_after_s):
            continue
        if owner is not None and owner.alive():
            continue
        deadline = trial.user_attrs.get(ATTR_DEADLINE)
        if owner is not None and owner.group == group and deadline is not None:
            died = death_time if death_time is not None else time.time()
            reason = "timeout" if died >= float(deadline) else "crash"
            try:
                storage.set_trial_user_attr(trial._trial_id, ATTR_REASON, reason)
                detail = f"its group died while running it (rank 0 was pid {owner.pid})"
                storage.set_trial_user_attr(trial._trial_id, ATTR_DETAIL, detail)
                study.tell(trial.number, state=TrialState.PRUNED)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
                continue
            resolved.append((trial.number, reason))
            continue
        try:
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        retry_interrupted(study, storage.get_trial(trial._trial_id))
        resolved.append((trial.number, "interrupted"))
    # Owners on other hosts: Optuna fails trials whose heartbeat went stale (and retries them).
    failed_before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    with quiet_optuna():
        optuna.storages.fail_stale_trials(study)
    failed_after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    resolved.extend((number, "stale") for number in sorted(failed_after - failed_before))
    for number, outcome in resolved:
        log.warning("study %s: trial %d resolved as %s", study.study_name, number, outcome)
    return resolved


class Heartbeat:
    """Records Optuna heartbeats for the trials this process holds, so other nodes can tell it's alive."""

    def __init__(self, storage: optuna.storages.RDBStorage, interval_s: float | None) -> None:
        self._storage = storage
        self._interval = interval_s
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval_s:
            self._thread = threading.Thread(target=self._loop, name="jointtune-heartbeat", daemon=True)
            self._thread.start()

    def add(self, trial_id: int) -> None:
        if self._interval:
            self._storage.record_heartbeat(trial_id)
        with self._lock:
            self._ids.add(trial_id)

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def _loop(self) -> None:
        assert self._interval is not None
        while not self._stop.wait(self._interval):
            with self._lock:
                ids = sorted(self._ids)
            for trial_id in ids:
                try:
                    self._storage.record_heartbeat(trial_id)
                except Exception:  # a missed beat is harmless; a dead database shows up elsewhere
                    log.exception("heartbeat for trial id %d failed", trial_id)

    def close(self) -> None:
        self._stop.set()
