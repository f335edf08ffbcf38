"""A rank process dies with the process that started it, and takes what it started along.

Why: the CLI that supervises a tuning group can die without running its cleanup (`kill -9`, the
OOM killer, a SIGTERM it doesn't handle). Its rank processes would go on under PID 1, finishing
studies nobody watches and timing kernels on GPUs that a restarted sweep then shares with them,
which skews both runs' measurements.

`bind_to_parent()` is the first thing a spawned rank does (`group.process_entry`):

1. The rank leads a process group of its own, which whatever it starts inherits (Triton's compiler
   runs, a plug-in's helper processes).
2. A reaper waits in that group until the rank is gone, however it ended, then kills the group:
   what a rank started never outlives it, on a supervisor's restart as on the CLI's death. It is a
   tiny fresh interpreter, not a fork (a rank already runs threads when it starts: OpenBLAS's), and
   holds no file of the run (not the store, not the resource tracker's pipe, which would keep the
   tracker alive); it exits within 0.2 s of the rank.
3. On Linux the kernel kills the rank when its parent dies (`PR_SET_PDEATHSIG`), even while it is
   stuck in a CUDA call or holds the GIL. Elsewhere, or if that fails, a thread waits on the
   parent's sentinel and kills the group.

Ctrl-C at a terminal reaches only the CLI (the ranks are out of the terminal's foreground group),
which ends them as before (TERM, then KILL). Linux sends the parent-death signal when the *thread*
that started the process exits, so start ranks from a thread that outlives them (the CLI starts
its `Supervisor`s from its main thread). Processes a rank starts in a session of their own escape
the group. Workers under torchrun are not bound: torchrun owns their lifecycle.

Example:
    >>> bind_to_parent()  # first line of a multiprocessing target        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading

#: Exit code of a rank whose parent died before it was bound (75 and 76: see `watchdog`).
EXIT_ORPHANED = 77

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Run with -I -S: no site-packages, no PYTHON* variables, nothing of the rank's but its group.
_REAPER = """\
import os, signal, sys, time
rank = int(sys.argv[1])
while os.getppid() == rank:
    time.sleep(0.2)
os.killpg(rank, signal.SIGKILL)
"""

#: this process's reaper, held so it is never reaped (or warned about) while the rank runs
_reaper: subprocess.Popen[bytes] | None = None

log = logging.getLogger(__name__)


def bind_to_parent() -> None:
    """Make this process, a multiprocessing child, and everything it starts die with its parent.

    Call it first in the child, before it starts anything: only what starts later joins its group.
    Does nothing in a process that multiprocessing didn't start.
    """
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return
    leads = _lead_own_group()
    armed = _parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent.pid:  # the parent died before the signal was armed
        os._exit(EXIT_ORPHANED)
    if leads:
        _start_reaper()
    if not armed:
        threading.Thread(
            target=_die_with, args=(parent.sentinel, leads), name="jointtune-lifeline", daemon=True
        ).start()


def _lead_own_group() -> bool:
    """Put this process at the head of a process group of its own; True if it leads one."""
    if not hasattr(os, "setpgid"):
        return False
    with contextlib.suppress(PermissionError):  # a session leader already leads its group, and can't leave it
        os.setpgid(0, 0)
    if os.getpgid(0) != os.getpid():
        return False
    # Out of the terminal's foreground group, a write to a terminal set to `stty tostop` would
    # stop the process (SIGTTOU), and with it the whole group; ignored, the write goes through.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    return True


def _parent_death_signal(sig: int) -> bool:
    """Linux: the kernel sends `sig` to this process when its parent exits. False where it can't."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        args = (ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        return bool(libc.prctl(_PR_SET_PDEATHSIG, *args) == 0)
    except (OSError, AttributeError):
        return False


def _start_reaper() -> None:
    global _reaper
    command = [sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid())]
    try:  # close_fds (the default): it holds none of the rank's files; stderr stays, to report its own failure
        _reaper = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except OSError as exc:  # the rank still dies with its parent; only its children might not
        log.warning("no reaper for rank process %d: %s", os.getpid(), exc)


def _die_with(sentinel: int, leads_group: bool) -> None:
    """The portable backstop: once the parent's sentinel is ready (the parent is gone), end it all."""
    multiprocessing.connection.wait([sentinel])
    if leads_group:
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGKILL)  # this process, its reaper and its children
    os._exit(EXIT_ORPHANED)
