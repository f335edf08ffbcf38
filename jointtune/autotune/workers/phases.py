"""Where a tuning run's wall time goes: named phases with wall-clock stamps, from every process of the run.

Set `JOINTTUNE_PHASES` to a file and every process of a `tune` or `sweep` (the CLI, each rank, each compile worker)
appends one JSON line per phase to it, e.g.

    {"who": "rank0", "pid": 4711, "phase": "measure", "t0": 1764150000.12, "t1": 1764150000.31, "trial": 7}

`t0` and `t1` are seconds since the epoch, so the lines of different processes line up; `phase="start"` runs from
the process's own start (read from /proc on Linux) to the moment the tuner first ran code in it: the interpreter
and the imports before. `bench/tuner/cold_phases.py` adds the lines up (imports, world set-up, compiles waited for,
checks, measurements, the store). Unset, nothing is written and a phase costs an environment lookup.

Example:
    >>> with phase("measure", trial=3):                 # doctest: +SKIP
    ...     samples = measure(...)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

#: the environment variable naming the file the phases go to
PHASES_ENV = "JOINTTUNE_PHASES"

_who = "main"
_entered: float | None = None
_lap: float | None = None


def set_who(who: str) -> None:
    """Name this process in its lines ("cli", "rank0", "compile")."""
    global _who
    _who = who


def enabled() -> bool:
    return bool(os.environ.get(PHASES_ENV))


def record(name: str, t0: float, t1: float | None = None, **fields: Any) -> None:
    """Append one phase (epoch seconds `t0` to `t1`, default now) to the phases file, if one is set."""
    path = os.environ.get(PHASES_ENV)
    if not path:
        return
    line = {"who": _who, "pid": os.getpid(), "phase": name, "t0": t0, "t1": time.time() if t1 is None else t1}
    line.update(fields)
    try:
        with open(path, "a") as handle:  # one short write per line: lines of many processes don't interleave
            handle.write(json.dumps(line, default=str) + "\n")
    except OSError:  # a diagnostic never fails a tune
        pass


@contextlib.contextmanager
def phase(name: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """Record the time spent in the block as phase `name`; the block may add fields to the yielded dict."""
    if not enabled():
        yield fields
        return
    t0 = time.time()
    try:
        yield fields
    finally:
        record(name, t0, **fields)


def record_start() -> None:
    """Record phase "start": from this process's start to now (nothing where the start can't be read); `entered`
    says when."""
    global _entered
    _entered = time.time()
    started = process_start()
    if started is not None and enabled():
        record("start", started, _entered)


def lap(name: str) -> None:
    """Record phase "lap:`name`": from the previous lap (or `record_start`) to now. One line per step of a
    sequence (the CLI's set-up) without wrapping each."""
    global _lap
    now = time.time()
    if enabled():
        record(f"lap:{name}", _lap if _lap is not None else entered(), now)
    _lap = now


def entered() -> float:
    """When this process recorded its start (`record_start`), else now."""
    return time.time() if _entered is None else _entered


def process_start() -> float | None:
    """This process's start, seconds since the epoch, to 10 ms (Linux: /proc), else None."""
    try:
        with open("/proc/self/stat") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks since boot
        with open("/proc/uptime") as handle:
            uptime, now = float(handle.read().split()[0]), time.time()
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return None
