"""Processes as /proc shows them (Linux), for the tests that kill parts of a run; and a bound sleeper.

A run's processes are found by a marker in their environment (`marked`): every process inherits it,
and keeps it when it is re-parented to PID 1 or moves to a process group or session of its own.
Importable by every process (like `jt_families`): `bound_sleeper` is a multiprocessing target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def parent(pid: int) -> int | None:
    """The parent of `pid`, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


def children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and parent(int(p.name)) == pid]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def marked(name: str, value: str) -> list[int]:
    """Live processes whose environment holds `name=value` (a zombie's reads empty; others' unreadable)."""
    entry = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def describe(pids: list[int]) -> str:
    return "; ".join(f"pid {pid} (parent {parent(pid)}): {cmdline(pid)[:200]}" for pid in pids)


def bound_sleeper(backstop_only: bool, ready: str) -> None:
    """A multiprocessing target: bind to the parent, start a child, write `ready` (pid, threads), sleep."""
    from jointtune.autotune.workers import lifeline

    if backstop_only:  # as where the kernel has no parent-death signal (macOS)
        lifeline._parent_death_signal = lambda sig: False
    lifeline.bind_to_parent()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(f"{ready}.tmp").write_text(" ".join([str(os.getpid()), *(t.name for t in threading.enumerate())]))
    os.replace(f"{ready}.tmp", ready)  # whole, or not there yet
    time.sleep(600)


def subprocess_environment() -> dict[str, str]:
    """Environment for `jointtune ...` subprocesses: test families importable, short heartbeats, no store URL."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env["JOINTTUNE_HEARTBEAT_S"] = "1"
    env["JOINTTUNE_GRACE_S"] = "3"
    env["COLUMNS"] = "200"
    env.pop("JOINTTUNE_DB_URL", None)
    return env
