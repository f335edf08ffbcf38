"""`jointtune ...`: one typer app; each command group lives in its own module of this package.

A module joins the app by defining `register(app)` (modules named `_*` are helpers, not commands);
discovery keeps command groups independent of each other. Errors we raise on purpose and usage
errors (a missing or malformed option) become one line on stderr and exit code 2.
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
        code = app(args=argv, standalone_mode=False, prog_name="jointtune")
    except JointtuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as exc:
        # usage errors (click's, or the copy typer vendors): one line too, naming the option
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            if type(exc).__name__ == "NoArgsIsHelpError" or not callable(getattr(exc, "format_message", None)):
                exc.show()  # a bare `jointtune db`: the help is the answer
                raise SystemExit(exc.exit_code) from None
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            print(f"error: {' '.join(exc.format_message().split())}{hint}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        raise
    if isinstance(code, int) and code:
        raise SystemExit(code)
