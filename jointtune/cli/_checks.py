"""Checks of the tuning commands' paths and options, run before any work starts.

A tuning run can take hours: an option that only fails at its end (a `--report` path that is a file,
say) wastes all of it. Every check here raises a TuningError whose one line names the option, the
value and what is allowed; `jointtune.cli.main` prints it and exits 2.

Example:
    >>> check_profile("cpu", on_gpu=False)
    'cpu'
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from jointtune.errors import DatabaseURLError, TuningError

PROFILES = ("auto", "gpu", "cpu")


def check_profile(profile: str, *, on_gpu: bool) -> str:
    """The profile to run: `auto` picks gpu where CUDA is visible; `gpu` needs a GPU (the CPU
    interpreter would take days over the GPU shapes)."""
    if profile not in PROFILES:
        raise TuningError(f"--profile: {profile!r} is not allowed; allowed: {', '.join(PROFILES)}")
    if profile == "auto":
        return "gpu" if on_gpu else "cpu"
    if profile == "gpu" and not on_gpu:
        raise TuningError(
            "--profile: 'gpu' is not allowed on this machine; torch sees no CUDA GPU "
            "(allowed here: cpu or auto, which tune the small shapes in Triton's CPU interpreter)"
        )
    return profile


def prepare_report_dir(text: str | None) -> Path | None:
    """Make `--report`'s directory now and prove it writable, so the report at the end can't fail.

    An existing file is refused rather than replaced: `--report README.md` is a typo, not a wish; an empty
    value too (an unset variable in a script), rather than read as the current directory.
    """
    if text is None:
        return None
    allowed = "allowed: a directory (new or existing) for the tuning-curve PNGs and results.json"
    if not text.strip():
        raise TuningError(f"--report: {text!r} is empty; {allowed}")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise TuningError(f"--report: {str(path)!r} is an existing file; {allowed}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TuningError(f"--report: {str(path)!r} can't be created ({exc.strerror}); {allowed}") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise TuningError(f"--report: {str(path)!r} is not writable ({exc.strerror}); {allowed}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TuningError(f"--report: {str(path)!r} is not writable; {allowed}")
    return path


def existing_store_url(db: str | None, *, option: str = "--db") -> str:
    """The store a read-only command (or a worker joining a sweep) opens. A SQLite file that isn't there is
    refused: opening it would leave a new empty store at a mistyped path and show or find nothing."""
    from sqlalchemy.engine import make_url

    from jointtune.db import ENV_DB_URL, is_memory_sqlite, resolve_db_url

    url = resolve_db_url(db)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or is_memory_sqlite(url) or Path(parsed.database or "").exists():
        return url
    source = option if db is not None else f"${ENV_DB_URL}" if os.environ.get(ENV_DB_URL) else "store"
    raise DatabaseURLError(
        f"{source}: {parsed.database!r} does not exist; give an existing store (`db upgrade`, `tune` and `serve` "
        "make one)"
    )
