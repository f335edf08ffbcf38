"""The record key: what names a record (`record.KEY_FIELDS`: kernel, kernel version, shape, dtype, world size,
hardware, timing policy), built from `schema.RecordIn` the way `NewRecord` and `Record` are (its fields, types and
defaults), and checked with RecordIn's own rules. The store's lookups and filters, the config client, the lookup
route, the decorator's run-time identity (`Identity.key`) and the tuner's key (`TuningKey`, a RecordKey) all carry
it, so the key is defined once.

Example:
    >>> key = RecordKey(kernel="ag_gemm", kernel_version="3f2a", shape={"N": 4096, "M": 8192}, dtype="bf16",
    ...                 world_size=2, hardware_id="h200x2-nvl")
    >>> key.checked().dtype, key.checked().shape_key, key.timing
    ('bfloat16', 'M=8192,N=4096', 'gpu')
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, ValidationError, create_model

from jointtune.canonical import shape_key
from jointtune.db._values import InvalidRecordError, invalid
from jointtune.db.record import FIELD_TYPES, KEY_FIELDS, _dataclass, _default
from jointtune.dtypes import canonical_dtype

if TYPE_CHECKING:
    from typing_extensions import Self


class _KeyMethods:
    """RecordKey's methods; its fields are `KEY_FIELDS`, with RecordIn's types and defaults."""

    @classmethod
    def of(cls, record: Any, **changes: Any) -> Self:
        """The key of a record (a NewRecord, Record or RecordIn, or another key), with `changes`."""
        return cls(**{name: changes[name] if name in changes else getattr(record, name) for name in KEY_FIELDS})

    @classmethod
    def any(cls, **given: Any) -> Self:
        """A filter: the given fields, None (any value) for the others, timing included."""
        return cls(**{name: None for name in KEY_FIELDS} | given)

    @property
    def shape_key(self) -> str:
        return shape_key(self.shape)  # type: ignore[attr-defined]

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def checked(self, *, versioned: bool = True) -> Self:
        """This key with canonical values (dtype aliases resolved, dims sorted) if the store's schema allows every
        field, else InvalidRecordError naming each bad one; `kernel_version` may be None (any version) only when
        not `versioned` (a nearest lookup)."""
        if versioned and self.kernel_version is None:  # type: ignore[attr-defined]
            raise InvalidRecordError(
                "query: kernel_version: None is not allowed; exact lookups need a version",
                [{"loc": ["kernel_version"], "msg": "exact lookups need a version", "type": "missing"}],
            )
        try:
            checked = _KeyIn.model_validate(self.to_json())
        except ValidationError as exc:
            raise invalid("query", exc) from None
        data = checked.model_dump()
        return type(self)(**{**data, "shape": dict(sorted(data["shape"].items()))})

    def where(self) -> dict[str, Any]:
        """The fields a filter names (those not None), with the dtype under the name the store keeps."""
        given = {name: getattr(self, name) for name in KEY_FIELDS if getattr(self, name) is not None}
        if "dtype" in given:
            given["dtype"] = canonical_dtype(given["dtype"]) or given["dtype"]
        return given

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in KEY_FIELDS}


RecordKey = _dataclass(
    "RecordKey",
    """What names a record: kernel, kernel version, shape, dtype, world size, hardware and timing policy (RecordIn's
    fields and types, timing "gpu" unless given). The store, the config client, the service's lookup route, the
    decorator's run-time identity and the tuner's key all carry it; a field None means any value where a query
    allows it (`kernel_version` of a nearest lookup; any field of `Store.list_records`' filter, `RecordKey.any`).

    Example:
        >>> key = RecordKey(kernel="ag_gemm", kernel_version="3f2a", shape={"N": 4096, "M": 8192}, dtype="bf16",
        ...                 world_size=2, hardware_id="h200x2-nvl")
        >>> key.checked().dtype, key.checked().shape_key, key.timing
        ('bfloat16', 'M=8192,N=4096', 'gpu')
    """,
    _KeyMethods,
    KEY_FIELDS,
    defaults=True,
)
RecordKey.__module__ = __name__

#: a key's checks: RecordIn's types, any kernel version where a query allows it
_KeyIn = create_model(
    "RecordKeyIn",
    __config__=ConfigDict(strict=True, extra="forbid", frozen=True),
    __module__=__name__,
    **{
        name: (
            FIELD_TYPES[name] | None if name == "kernel_version" else FIELD_TYPES[name],
            ... if _default(name) is dataclasses.MISSING else _default(name),
        )
        for name in KEY_FIELDS
    },
)


__all__ = ["RecordKey"]
