"""Checks on the arguments of the store's queries and registrations, before any SQL runs.

A bad argument is the caller's bug or a client's bad request, not a database problem: it raises
InvalidRecordError (a ValueError) naming every bad field, so the service can answer 422 with it.
The rules are the store's schema (`_schema`), so a key that passes can name any stored record.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from jointtune.db._values import InvalidRecordError, invalid
from jointtune.db.schema import MAX_INT32, TIMINGS, HardwareIn, Name64, Name128

#: the most rows one list call returns
MAX_PAGE = 10_000


def check_timing(timing: Any) -> None:
    """A timing filter: None (any policy) or one of TIMINGS."""
    if timing is not None and timing not in TIMINGS:
        raise InvalidRecordError(
            f"query: timing: {timing!r} is not allowed; allowed: {', '.join(TIMINGS)}",
            [{"loc": ["timing"], "msg": f"allowed: {', '.join(TIMINGS)}", "type": "literal_error"}],
        )


def check_page(limit: Any, offset: Any) -> None:
    problems: list[str] = []
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        problems.append(f"limit: {limit!r} is not allowed; it must be an integer in 1..{MAX_PAGE}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        problems.append(f"offset: {offset!r} is not allowed; it must be an integer >= 0")
    if problems:
        raise InvalidRecordError("query: " + "; ".join(problems))


def check_hardware(hardware_id: Any, name: Any, fingerprint: Any) -> HardwareIn:
    try:
        return HardwareIn.model_validate({"hardware_id": hardware_id, "name": name, "fingerprint": fingerprint})
    except ValidationError as exc:
        raise invalid(f"hardware profile {hardware_id!r:.80}", exc) from None


class _Kernel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    kernel: Name128
    kernel_version: Name64


def check_kernel(name: Any, version: Any) -> None:
    try:
        _Kernel.model_validate({"kernel": name, "kernel_version": version})
    except ValidationError as exc:
        raise invalid("kernel", exc) from None


def in_id_range(record_id: Any) -> bool:
    """Whether `record_id` can name a record at all (1 .. 2**31 - 1, PostgreSQL's integer): ids
    outside it are simply not there, without asking a database that would refuse the number."""
    return isinstance(record_id, int) and not isinstance(record_id, bool) and 1 <= record_id <= MAX_INT32
