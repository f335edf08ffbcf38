"""Helpers of the lookup route: reading shape dims from the query string, and explaining a miss.

Dims travel as query parameters named after the kernel's dims (`?M=8192&N=4096&K=12288`); every
parameter that is not a known field is a dim. A miss answers with what the store does have
nearby, so a user can tell a typo'd dtype from a shape nobody has tuned yet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from jointtune.db import Store, shape_key
from jointtune.db.schema import DIM_NAME_RE, MAX_DIM, MAX_DIMS, printable

if TYPE_CHECKING:
    from jointtune.search_spaces import Space

_DIM_NAME = re.compile(DIM_NAME_RE)
_SCAN = 1000


def _error(name: str, msg: str) -> dict[str, Any]:
    return {"loc": ["query", name], "msg": msg, "type": "value_error"}


def parse_dims(
    params: Iterable[tuple[str, str]], known: set[str], dims: tuple[str, ...] | None = None
) -> dict[str, int]:
    """The shape from the query; 422 naming every bad parameter. `dims`: the kernel's dims where its family is
    registered here, so a misspelt parameter (`timng=gpu`) is named as such, not read as a dim."""
    shape: dict[str, int] = {}
    errors: list[dict[str, Any]] = []
    for name, raw in params:
        if name in known:
            continue
        if dims is not None and name not in dims:
            errors.append(_error(printable(name, 64), f"not a known parameter and not a dim of this kernel (its "
                                 f"dims: {', '.join(dims)})"))  # fmt: skip
        elif not _DIM_NAME.match(name):
            errors.append(_error(printable(name, 64), "not a known parameter and not a dim name (use an identifier "
                                 "of <= 32 characters like M)"))  # fmt: skip
        elif name in shape:
            errors.append(_error(name, "given more than once"))
        elif not raw.isascii() or not raw.isdigit() or len(raw) > 16 or not 1 <= int(raw) <= MAX_DIM:
            errors.append(_error(name, f"{printable(raw, 32)!r} is not allowed; dims must be integers in 1..{MAX_DIM}"))
        else:
            shape[name] = int(raw)
    if not shape and not errors:
        errors.append(_error("dims", "no dims given; pass the kernel's dims as query parameters, e.g. ?M=8192&N=4096"))
    if len(shape) > MAX_DIMS:
        errors.append(_error("dims", f"{len(shape)} dims is not allowed; at most {MAX_DIMS}"))
    if errors:
        raise HTTPException(422, errors)
    return shape


def registered_space(kernel: str) -> Space | None:
    """`kernel`'s space where its family is registered in this process (None: any dim names go, as given)."""
    from jointtune.search_spaces import get_space, space_names

    return get_space(kernel) if kernel in space_names() else None


def keyed_shape(space: Space | None, shape: dict[str, int], dtype: str, world_size: int) -> dict[str, int]:
    """The shape records of it are stored under: a registered family's space may bucket a dim (flash_decode's S),
    as its decorator's key does, so any length in a bucket finds the bucket's record exactly. Shapes the space
    would not take (other dims, or dims it refuses) are looked up as given."""
    from jointtune.errors import SpaceError
    from jointtune.search_spaces import Problem

    if space is None or not space.buckets or set(shape) != set(space.dims):
        return shape
    try:
        return space.stored_problem(Problem.of(shape, dtype=dtype, world_size=world_size)).dims
    except SpaceError:
        return shape


def _log_distance(a: dict[str, int], b: dict[str, int]) -> float:
    return math.sqrt(sum((math.log2(a[k]) - math.log2(b[k])) ** 2 for k in a))


def explain_miss(store: Store, *, kernel: str, shape: dict[str, int], query: dict[str, Any]) -> str:
    """A 404 message that says what exists for this kernel: the closest shapes, dtypes, world sizes."""
    asked = ", ".join(f"{k}={v}" for k, v in query.items() if v is not None)
    base = f"no stored config for kernel {kernel!r} with {asked} and shape {shape_key(shape)}"
    on_hw = store.list_records(kernel=kernel, hardware_id=query["hardware_id"], limit=_SCAN)
    if not on_hw:
        hardware = sorted({r.hardware_id for r in store.list_records(kernel=kernel, limit=_SCAN)})
        return f"{base}; kernel {kernel!r} has records only for hardware {hardware}"
    same = [r for r in on_hw if r.dtype == query["dtype"] and r.world_size == query["world_size"]]
    timed = [r for r in same if r.timing == query["timing"]]
    if same and not timed:
        policies = sorted({r.timing for r in same})
        return f"{base}; no record was measured with timing {query['timing']!r}; these policies have: {policies}"
    same = timed
    if query.get("kernel_version") is not None:
        versioned = [r for r in same if r.kernel_version == query["kernel_version"]]
        if same and not versioned:
            versions = sorted({r.kernel_version for r in same})
            return f"{base}; kernel_version {query['kernel_version']!r} has none, these do: {versions}"
        same = versioned
    if not same:
        combos = sorted({(r.dtype, r.world_size) for r in on_hw})
        listed = ", ".join(f"dtype={d} world_size={w}" for d, w in combos[:10])
        return f"{base}; on this hardware the kernel has records for: {listed}"
    comparable = [r for r in same if set(r.shape) == set(shape)]
    if not comparable:
        dims = " or ".join(sorted({",".join(sorted(r.shape)) for r in same}))
        return f"{base}; stored shapes have dims {dims}, the query has {','.join(sorted(shape))}"
    closest = sorted(comparable, key=lambda r: _log_distance(shape, r.shape))[:3]
    return f"{base}; closest stored shapes: " + "; ".join(shape_key(r.shape) for r in closest)
