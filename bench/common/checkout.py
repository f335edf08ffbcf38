"""`--tree DIR`: run a bench script against another checkout's `jointtune` (before/after and variant comparisons).

Import this module first: it reads `--tree` from the command line and imports that checkout's `jointtune`, so that
the bench modules imported after it (which put this checkout on the path) find it already loaded.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path


def tree_from_argv() -> Path:
    """The checkout named by `--tree DIR` (or `--tree=DIR`), else this one."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--tree" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if a.startswith("--tree="):
            return Path(a.split("=", 1)[1]).resolve()
    return Path(__file__).resolve().parents[2]


def add_tree_argument(ap: argparse.ArgumentParser) -> None:
    """Declare `--tree` to a script's parser (this module has read it already), so that `--help` shows it."""
    ap.add_argument("--tree", default="", help="the checkout whose jointtune is run (default: this one)")


sys.path.insert(0, str(tree_from_argv()))
jointtune = importlib.import_module("jointtune")
TREE = Path(jointtune.__file__).resolve().parents[1]  # the checkout actually in use
