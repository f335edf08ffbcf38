"""`jointtune ...`: one typer app; each command group lives in its own module of this package.

A module joins the app by defining `register(app)`; discovery keeps command groups independent
of each other. Errors we raise on purpose become one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from jointtune.errors import JointtuneError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Joint compute+communication autotuner for fused multi-GPU kernels.",
)


@app.callback()
def _root() -> None:
    """Keeps typer in group mode even if only one command module exists."""


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning our errors into one clear line."""
    try:
        code = app(args=argv, standalone_mode=False)
    except JointtuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as exc:
        # usage errors (click's, or the copy typer vendors) know how to print themselves
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise
    if isinstance(code, int) and code:
        raise SystemExit(code)
