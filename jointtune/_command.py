"""How to type `jointtune` in the caller's shell, so every command jointtune prints works as pasted.

After `make sweep` the console script is `.venv/bin/jointtune`, which a shell finds only once the venv is
activated (`. .venv/bin/activate`). A hint that says `jointtune db list` would then fail with "command not
found", so hints name the script the way this shell can run it: `jointtune` where the PATH finds this
very script, else its path (relative to the working directory when it lies below it), else
`python -m jointtune.cli` with this interpreter.

Example:
    >>> jointtune_command()                        # doctest: +SKIP
    '.venv/bin/jointtune'
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

NAME = "jointtune"


def _script() -> Path | None:
    """This process's console script: the one it was started as, else the one beside its interpreter."""
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name == NAME and started.is_file():
        return started
    beside = Path(sys.executable).parent / NAME
    return beside if beside.is_file() else None


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def jointtune_command() -> str:
    """`jointtune`, or the path (or `python -m` line) that runs this installation from the current shell."""
    script = _script()
    if script is None:
        return f"{shlex.quote(sys.executable)} -m jointtune.cli"
    found = shutil.which(NAME)
    if found is not None and _same(found, script):
        return NAME
    absolute = Path(os.path.abspath(script))
    try:
        relative = absolute.relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(absolute))
    return shlex.quote(str(relative) if relative.parent != Path(".") else f"./{relative}")


__all__ = ["jointtune_command"]
