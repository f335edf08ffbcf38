"""Checks on the arguments of the store's queries and registrations, before any SQL runs.

A bad argument is the caller's bug or a client's bad request, not a database problem: it raises
InvalidRecordError (a ValueError) naming every bad field, so the service can answer 422 with it.
"""

from __future__ import annotations

from typing import Any

from jointtune.db._values import (
    check_shape,
    check_text,
    check_world_size,
    config_hash,
    raise_problems,
)

#: the most rows one list call returns
MAX_PAGE = 10_000


def check_key(
    kernel: Any, kernel_version: Any, shape: Any, dtype: Any, world_size: Any, hardware_id: Any, *, versioned: bool
) -> None:
    """A lookup key; `kernel_version` may be None only when not `versioned` (any version)."""
    problems: list[str] = []
    check_text("kernel", kernel, problems)
    if versioned or kernel_version is not None:
        check_text("kernel_version", kernel_version, problems)
    check_shape(shape, problems)
    check_text("dtype", dtype, problems)
    check_world_size(world_size, problems)
    check_text("hardware_id", hardware_id, problems)
    raise_problems("query", problems)


def check_page(limit: Any, offset: Any) -> None:
    problems: list[str] = []
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        problems.append(f"limit: {limit!r} is not allowed; it must be an integer in 1..{MAX_PAGE}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        problems.append(f"offset: {offset!r} is not allowed; it must be an integer >= 0")
    raise_problems("query", problems)


def check_hardware(hardware_id: Any, name: Any, fingerprint: Any) -> None:
    problems: list[str] = []
    check_text("hardware_id", hardware_id, problems)
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        problems.append(f"name: {name!r} is not allowed; it must be a non-empty string of <= 256 chars")
    try:
        if not isinstance(fingerprint, dict):
            raise TypeError
        config_hash(fingerprint)  # serialisable as strict JSON
    except (TypeError, ValueError):
        problems.append(f"fingerprint: {fingerprint!r} is not allowed; it must be a JSON object")
    raise_problems(f"hardware profile {hardware_id!r}", problems)


def check_kernel(name: Any, version: Any) -> None:
    problems: list[str] = []
    check_text("kernel", name, problems)
    check_text("kernel_version", version, problems)
    raise_problems("kernel", problems)
