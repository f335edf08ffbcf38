"""Helpers of the lookup route: reading shape dims from the query string, and explaining a miss.

Dims travel as query parameters named after the kernel's dims (`?M=8192&N=4096&K=12288`); every
parameter that is not a known field is a dim. A miss answers with what the store does have
nearby, so a user can tell a typo'd dtype from a shape nobody has tuned yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from jointtune.db import RecordKey, Store, shape_key
from jointtune.db.schema import DIM_NAME_RE, MAX_DIM, MAX_DIMS, printable
from jointtune.server.limits import MAX_LISTED_IDS, listed

if TYPE_CHECKING:
    from jointtune.search_spaces import Space

_DIM_NAME = re.compile(DIM_NAME_RE)


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


#: how many of each kind of stored value a miss's message lists
SHOWN = 10


def explain_miss(store: Store, key: RecordKey) -> str:
    """A 404 message that says what exists for the key's kernel: hardware, dtypes and world sizes, timing policies,
    kernel versions, dims, the closest shapes (for a kernel without records: the kernels that have some).
    Each part is one bounded read of the lookup index's range for the key's prefix (`Store.key_values`,
    `Store.hardware_ids`), never the records themselves: an anonymous client can ask for misses as fast as
    for hits."""
    kernel, shape = key.kernel, key.shape
    asked = ", ".join(f"{name}={getattr(key, name)}" for name in ("kernel_version", "dtype", "world_size",
                      "hardware_id", "timing") if getattr(key, name) is not None)  # fmt: skip
    base = f"no stored config for kernel {kernel!r} with {asked} and shape {shape_key(shape)}"
    same = store.key_values(("timing", "kernel_version", "dims_signature"), key)
    if not same:
        combos = store.key_values(("dtype", "world_size"), RecordKey.any(kernel=kernel, hardware_id=key.hardware_id),
                                  limit=SHOWN)  # fmt: skip
        if not combos:
            ids, total = store.hardware_ids(kernel=kernel, limit=MAX_LISTED_IDS)
            if not ids:
                names = listed(*store.kernel_names(limit=MAX_LISTED_IDS))
                return f"kernel {kernel!r} is unknown; the store has records for {names}"
            return f"{base}; kernel {kernel!r} has records only for hardware {listed(ids, total)}"
        shown = ", ".join(f"dtype={d} world_size={w}" for d, w in combos)
        return f"{base}; on this hardware the kernel has records for: {shown}"
    timed = [s for s in same if s[0] == key.timing]
    if not timed:
        policies = sorted({s[0] for s in same})
        return f"{base}; no record was measured with timing {key.timing!r}; these policies have: {policies}"
    if key.kernel_version is not None:
        versioned = [s for s in timed if s[1] == key.kernel_version]
        if not versioned:
            versions = sorted({s[1] for s in timed})[:SHOWN]
            return f"{base}; kernel_version {key.kernel_version!r} has none, these do: {versions}"
        timed = versioned
    signature = ",".join(sorted(shape))
    if signature not in {s[2] for s in timed}:
        dims = " or ".join(sorted({s[2] for s in timed})[:SHOWN])
        return f"{base}; stored shapes have dims {dims}, the query has {signature}"
    closest = store.nearest(key, limit=3)
    return f"{base}; closest stored shapes: " + "; ".join(shape_key(r.shape) for r, _ in closest)
