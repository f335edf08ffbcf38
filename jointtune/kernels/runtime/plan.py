"""A call resolved once: the config checked by its family's space, then a frozen launch plan.

A plan is built per (world, family, shapes, dtype, config, and whatever else it bakes in) and kept by
the world (`World.plan`). Building one validates the config with the family's space (the only check:
launchers have no second rule book), allocates symmetric buffers and address tables, and prepares every
launch; a repeat call only binds the caller's tensors and issues them. Everything a plan holds is the
same on every call, which is what lets a CUDA graph capture a call and replay it.

Example:
    >>> from jointtune.kernels.runtime.world import create_world
    >>> world = create_world("local", world_size=2)
    >>> resolve_config("ag_gemm", {"mode": "baseline"}, {"M": 64, "N": 64, "K": 32}, "bfloat16", world)
    {'mode': 'baseline', 'collective': 'nccl'}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jointtune.errors import SpaceError
from jointtune.kernels.runtime.device import device_limits

if TYPE_CHECKING:
    from jointtune.kernels.runtime.world import World


def config_key(config: Mapping[str, Any]) -> frozenset[tuple[str, type, Any]]:
    """A hashable form of a config (the plan cache's key part); refuses values that don't hash.

    Each value goes with its type: `True == 1 == 1.0` in Python, and the space refuses `True` where it wants
    a number, so a cached `1` must not let a later `True` skip that check."""
    try:
        return frozenset((name, type(value), value) for name, value in config.items())
    except (AttributeError, TypeError) as exc:
        raise SpaceError(f"config: {config!r} is not allowed; it must be a mapping of field -> number or text") from exc


def resolve_config(
    space: str, config: Mapping[str, Any], shape: Mapping[str, int], dtype: str, world: World
) -> dict[str, Any]:
    """`config` validated by `space` for this shape, dtype, world size and device; SpaceError names the fields."""
    return dict(
        _resolve(space, config_key(config), tuple(sorted(shape.items())), dtype, world.world_size, world.device)
    )


@functools.lru_cache(maxsize=4096)
def _resolve(space: str, items: frozenset, shape: tuple, dtype: str, world_size: int, device: Any) -> tuple:
    from jointtune.search_spaces import Problem, get_space

    problem = Problem.of(dict(shape), dtype=dtype, world_size=world_size)
    canonical = get_space(space).validate({name: value for name, _, value in items}, problem, device_limits(device))
    return tuple(canonical.items())
