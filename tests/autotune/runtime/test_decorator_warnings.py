"""Warnings point at the caller's line, not at ours: `jointtune._warnings` walks out of the package's frames
(and library frames between them) however deep in the package the warning is made."""

from __future__ import annotations

import socket
import sys
import warnings
from pathlib import Path

import torch
from test_decorator_helpers import World, make_launcher

from jointtune._warnings import PACKAGE_DIR, caller_stacklevel
from jointtune.autotune.runtime.client import ServiceWarning
from jointtune.autotune.runtime.lookup import LookupWarning


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_service_and_a_broken_store_are_reported_at_the_callers_line(tmp_path: Path) -> None:
    """Two warnings from different depths of the lookup chain: both name this file and the line of the call."""
    (tmp_path / "store").mkdir()  # a directory where the store's file should be: the store can't be opened
    launch = make_launcher(
        f"sqlite:///{tmp_path / 'store'}", server=f"http://127.0.0.1:{_closed_port()}", on_miss="default"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        launch(torch.ones(64), world=World(2))
    ours = [w for w in caught if issubclass(w.category, (ServiceWarning, LookupWarning))]
    assert {w.category for w in ours} == {ServiceWarning, LookupWarning}, [str(w.message) for w in caught]
    for w in ours:
        assert (w.filename, w.lineno) == (__file__, line), (w.filename, w.lineno, str(w.message))
        assert not w.filename.startswith(PACKAGE_DIR)


def test_the_walk_skips_library_frames_between_the_packages_frames() -> None:
    """Package code entered through the standard library (a context manager of ours, entered by contextlib,
    inside another function of ours): the warning still names this file's line, not contextlib's or ours."""
    source = (
        "import contextlib\n"
        "from jointtune._warnings import warn\n"
        "@contextlib.contextmanager\n"
        "def opened():\n"
        "    warn('from inside a context manager', UserWarning)\n"
        "    yield\n"
        "def outer():\n"
        "    with opened():\n"
        "        pass\n"
    )
    namespace: dict = {}
    exec(compile(source, str(Path(PACKAGE_DIR) / "_test_only_module.py"), "exec"), namespace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        namespace["outer"]()
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]
    assert caller_stacklevel() == 1  # called from outside the package: this very frame
