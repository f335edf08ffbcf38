"""One root exception; narrow subclasses also inherit the builtin that callers already catch.

Every message names the field, the value and what is allowed, so a user can fix the input
without reading our code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class JointtuneError(Exception):
    """Root of every error jointtune raises on purpose."""


class SpaceError(JointtuneError, ValueError):
    """A config, shape or space definition is invalid (names the field and what is allowed)."""


class ShapeError(JointtuneError, ValueError):
    """Tensor shapes, dtypes or devices passed to a kernel launcher don't fit together."""


class UnknownNameError(JointtuneError, KeyError):
    """A kernel, space or family name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else ""


def registered(table: Mapping[str, T], name: str, what: str) -> T:
    """`table[name]` of a registry, or UnknownNameError naming `what` it is (e.g. "kernel: 'x' is not a known kernel
    family") and the names there are."""
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none"
        raise UnknownNameError(f"{what.format(name=repr(name))}; known: {known}") from None


class StoreError(JointtuneError, RuntimeError):
    """The tuning store can't be opened, migrated, read or written."""


class DatabaseURLError(StoreError, ValueError):
    """A database URL that can't be parsed or names an unsupported backend."""


class KernelError(JointtuneError, RuntimeError):
    """A kernel failed to compile or launch, or produced a wrong result."""


class TuningError(JointtuneError, RuntimeError):
    """A tuning study could not run (not a failed trial: those are results)."""


class ServiceError(JointtuneError, RuntimeError):
    """The config service answered with an error or could not be reached."""
