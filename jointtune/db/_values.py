"""The plain values the store takes and returns besides records, and its error for refused values.

Callers never see ORM objects or sessions: hardware profiles and kernels are frozen dataclasses. The
record values (`NewRecord`, `Record`) are built from the schema in `record`.

Example:
    >>> InvalidRecordError("query: world_size: 0 is not allowed").problems
    [{'loc': [], 'msg': 'query: world_size: 0 is not allowed', 'type': 'value_error'}]
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from jointtune.db.schema import describe, problems_of
from jointtune.errors import StoreError


class InvalidRecordError(StoreError, ValueError):
    """A record or query argument the store refuses; the message names every bad field.

    `problems` holds the same as items {loc, msg, type} (loc relative to the record or query), which
    the service answers as its 422 `detail`.
    """

    def __init__(self, message: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [{"loc": [], "msg": message, "type": "value_error"}]


def invalid(what: str, exc: ValidationError) -> InvalidRecordError:
    """The store's error for a value the schema refused: one line naming every bad field."""
    return InvalidRecordError(f"{what}: {describe(exc)}", problems_of(exc))


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A machine type: `hardware_id` (what records refer to), a readable name, its fingerprint."""

    hardware_id: str
    name: str
    fingerprint: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class KernelInfo:
    """A kernel name at one source version that the store has seen."""

    name: str
    version: str
    created_at: datetime
