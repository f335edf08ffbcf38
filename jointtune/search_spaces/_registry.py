"""Spaces by name: families, the tuner and the CLI look a space up here, never by import path.

Example:
    >>> get_space("ag_gemm").dims
    ('M', 'N', 'K')
"""

from __future__ import annotations

from jointtune.errors import SpaceError, registered
from jointtune.search_spaces._space import Space

_SPACES: dict[str, Space] = {}


def register_space(space: Space, *, replace: bool = False) -> Space:
    """Add a space (tests and plug-in families use this); a second space of one name is an error."""
    if space.name in _SPACES and _SPACES[space.name] is not space and not replace:
        raise SpaceError(f"space: {space.name!r} is already registered; pass replace=True to override it")
    _SPACES[space.name] = space
    return space


def unregister_space(name: str) -> None:
    _SPACES.pop(name, None)


def get_space(name: str) -> Space:
    return registered(_SPACES, name, "space: {name} is not a known search space")


def space_names() -> list[str]:
    return sorted(_SPACES)
