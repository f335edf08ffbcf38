"""Warnings that point at the caller's line, however jointtune's own files are arranged.

`warnings.warn(stacklevel=N)` counts frames, so a warning lands on one of our own lines as soon as a
helper is added, moved or called from somewhere new. `warn` walks the stack instead: out of this
package's frames, and out of installed libraries' and the standard library's frames that sit between
ours (torch's dispatcher, a context manager), to the first frame of the caller's own code (a script,
a test, a module of theirs that uses a decorated function). Where the stack has no such frame (a
thread jointtune started), the innermost frame outside the package is the one reported. Python 3.12's
`skip_file_prefixes` skips only the innermost frames, and we support 3.10.

Example:
    >>> warn("config service http://127.0.0.1:9: unreachable; falling back", UserWarning)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import warnings

#: every module of the package lives under this directory
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Where the standard library and installed packages live (never the caller's own code)."""
    paths = sysconfig.get_paths()
    dirs = {paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths}
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(PACKAGE_DIR)


def _library(filename: str) -> bool:
    return filename.startswith("<") or os.path.abspath(filename).startswith(_library_dirs())


def caller_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` in the function calling this report the caller's line."""
    frame = sys._getframe(1)  # the function that will call warnings.warn: stacklevel 1
    level, first_outside = 1, None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _ours(filename):
            if not _library(filename):
                return level
            if first_outside is None:
                first_outside = level
        frame = frame.f_back
        level += 1
    return first_outside or 1


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)`, attributed to the caller's line outside jointtune."""
    warnings.warn(message, category, stacklevel=caller_stacklevel())


__all__ = ["PACKAGE_DIR", "caller_stacklevel", "warn"]
