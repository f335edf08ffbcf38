"""Per-trial watchdog: a hung config ends its process, so the supervisor restarts the group.

A config can hang a rank for ever (a push kernel waiting on a flag no peer will set). Nothing
inside the process can interrupt a running kernel, so the watchdog records the timeout (rank 0
tells Optuna the trial failed "timeout") and then ends the process with `EXIT_TIMEOUT`; the
supervisor (ours, or torchrun with --max-restarts) restarts the group, which goes on with the
next trial. A Python thread can't fire while the hung thread holds the GIL, so a C-level
backstop (`faulthandler`) exits the process `backstop_s` later whatever Python is doing; the
restarted group then sees the trial's deadline has passed and records the timeout itself.

Example:
    >>> dog = Watchdog()                          # doctest: +SKIP
    >>> dog.arm(30.0, on_expire=lambda: None)     # doctest: +SKIP
    >>> dog.disarm()                              # doctest: +SKIP
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

#: Exit code of a rank that wants its group restarted (a crashed trial or a lost peer).
EXIT_RESTART = 75
#: Exit code of a rank ended by its watchdog.
EXIT_TIMEOUT = 76

log = logging.getLogger(__name__)


class Watchdog:
    """One deadline at a time; `arm` replaces the previous one."""

    def __init__(self, *, backstop_s: float = 5.0, exit_code: int = EXIT_TIMEOUT) -> None:
        self.backstop_s = backstop_s
        self.exit_code = exit_code
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._on_expire: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._loop, name="jointtune-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, on_expire: Callable[[], None] | None = None) -> None:
        """End this process `seconds` from now unless `disarm` comes first."""
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._on_expire = on_expire
            self._cond.notify_all()
        faulthandler.dump_traceback_later(seconds + self.backstop_s, repeat=False, file=sys.stderr, exit=True)

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        with self._cond:
            self._deadline = None
            self._on_expire = None
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._deadline is None or time.monotonic() < self._deadline:
                    timeout = None if self._deadline is None else self._deadline - time.monotonic()
                    self._cond.wait(timeout)
                on_expire = self._on_expire
            self._expire(on_expire)

    def _expire(self, on_expire: Callable[[], None] | None) -> None:
        # Once expired, the process ends even if the trial finishes meanwhile: the verdict is out.
        if on_expire is not None:
            try:
                on_expire()
            except Exception:  # the restarted group recovers the trial from its deadline
                log.exception("watchdog: recording the timeout failed")
        sys.stderr.write(f"jointtune watchdog: trial deadline passed; ending process {os.getpid()}\n")
        sys.stderr.flush()
        os._exit(self.exit_code)
