"""A record's format, defined once: `RecordIn`'s fields and what the store adds to them.

`schema.RecordIn` is the one definition of what a tuner publishes: the field names, their order, types,
limits and defaults. Everything else that carries a record is built from it here, never retyped:

- `NewRecord`, the value a tuner hands the store: RecordIn's fields and defaults, in its order;
- `KEY_FIELDS`, what names a record (kernel, kernel version, shape, dtype, world size, hardware, timing policy),
  from which `jointtune.db.key.RecordKey` is built the same way: the one key the store, the client, the lookup
  route, the decorator's run-time identity and the tuner's key carry;
- `Record`, what the store holds and returns: RecordIn's fields plus `STORE_SET`, the fields the store
  sets (id, shape_key, config_hash, speedup, created_at, updated_at), declared only here;
- `LookupOut` (with `Latency3` and `Provenance`), the lookup's answer: the service builds it from a
  Record (`LookupOut.of`) and the client parses the service's answer with it, so both sides read one
  format. Fields named like a Record's have the Record's types.

Because the types are RecordIn's own (its Annotated aliases with their limits and JSON Schema), the
service's OpenAPI document states the same rules for `Record` and `LookupOut` as for `RecordIn`, and
tests/db/test_db_record.py checks that it does.

Why NewRecord and Record stay frozen dataclasses, generated with `dataclasses.make_dataclass`, and are not
pydantic models: they are the store's public value types, and callers rely on dataclass behaviour
(`dataclasses.fields`/`replace`/`asdict`, the repr, FrozenInstanceError, no validation on construction,
which keeps a lookup's read path free of it). Generating them keeps all of that and still leaves one
definition; the cost is that a static type checker sees their attributes as untyped. The lookup's answer
models are pydantic models (as they were), built with `create_model` from the same types.

Example:
    >>> rec = NewRecord(kernel="ag_gemm", kernel_version="3f2a", space_version="9c1d",
    ...                 shape={"M": 8192, "N": 4096, "K": 12288}, dtype="bf16", world_size=2,
    ...                 hardware_id="h200x2-nvl", triton_version="3.6", config={"BLOCK_M": 128},
    ...                 latency_p50_us=610.0, trials=64)
    >>> rec.validate().dtype, rec.shape_key
    ('bfloat16', 'K=12288,M=8192,N=4096')
    >>> PUBLISHED[:3], STORE_SET[0]
    (('kernel', 'kernel_version', 'space_version'), 'id')
    >>> LookupOut.of(store.best(...), 0.0).match                                   # doctest: +SKIP
    'exact'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticUndefined

from jointtune.canonical import shape_key
from jointtune.db._values import InvalidRecordError, invalid
from jointtune.db.schema import RecordId, RecordIn, _short

if TYPE_CHECKING:
    from typing_extensions import Self

#: the fields a tuner publishes, in RecordIn's order
PUBLISHED: tuple[str, ...] = tuple(RecordIn.model_fields)

#: the fields the store sets on a record it keeps, with their types: the record's id, the canonical text of
#: its shape (`canonical.shape_key`), its config's hash (`canonical.config_hash`), baseline_us / p50 (None
#: without a baseline), and when it was first stored and last replaced by a faster one
_STORE_SET: dict[str, Any] = {
    "id": RecordId,
    "shape_key": str,
    "config_hash": str,
    "speedup": float | None,
    "created_at": datetime,
    "updated_at": datetime,
}
STORE_SET: tuple[str, ...] = tuple(_STORE_SET)

#: every field's type: RecordIn's as declared (aliases, limits, validators, JSON Schema), then the store's
FIELD_TYPES: dict[str, Any] = {
    **{name: field.rebuild_annotation() for name, field in RecordIn.model_fields.items()},
    **_STORE_SET,
}


def _default(name: str) -> Any:
    """RecordIn's default of a published field (dataclasses.MISSING when it is required)."""
    default = RecordIn.model_fields[name].default
    return dataclasses.MISSING if default is PydanticUndefined else default


def _dataclass(name: str, doc: str, base: type, names: tuple[str, ...], *, defaults: bool) -> Any:
    """A frozen, keyword-only dataclass named `name` of these fields (RecordIn's defaults if `defaults`)."""
    missing = dataclasses.MISSING
    specs = [(n, FIELD_TYPES[n], dataclasses.field(default=_default(n) if defaults else missing)) for n in names]
    namespace = {"__doc__": doc, "__module__": __name__}
    return dataclasses.make_dataclass(name, specs, bases=(base,), namespace=namespace, frozen=True, kw_only=True)


class _NewRecordMethods:
    """NewRecord's methods; its fields come from RecordIn."""

    @property
    def shape_key(self) -> str:
        return shape_key(self.shape)  # type: ignore[attr-defined]

    def validate(self) -> Self:
        """This record with canonical values (dtype aliases resolved, dims sorted) if every field is
        allowed by the store's schema (`RecordIn`), else InvalidRecordError naming each bad field. A record
        built by `of` from a checked RecordIn is returned as it is: a REST publish checks its body once (the
        kernel's space check costs about 75 us), not once in the route and again in the store."""
        if self.__dict__.get("_checked"):
            return self
        try:
            checked = RecordIn.model_validate(self.to_json())
        except ValidationError as exc:
            raise invalid(f"record for kernel {_short(self.kernel)}", exc) from None  # type: ignore[attr-defined]
        return type(self).of(checked)

    @classmethod
    def for_key(cls, key: Any, **result: Any) -> Self:
        """A result to publish for `key` (a `RecordKey`, or anything with its fields): the key's fields, then the
        result's own (space and Triton versions, config, latencies, baseline, trials, study). Tuners build every
        record they publish here."""
        return cls(**{name: getattr(key, name) for name in KEY_FIELDS}, **result)

    @classmethod
    def of(cls, checked: RecordIn) -> Self:
        """The NewRecord of a record the schema accepted (dims sorted by name)."""
        data = checked.model_dump()
        data["shape"] = dict(sorted(data["shape"].items()))
        record = cls(**data)
        object.__setattr__(record, "_checked", True)  # not a field: equality, JSON and `replace` ignore it
        return record

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Build from JSON and validate; the fields only a stored Record has (`STORE_SET`) are ignored."""
        if not isinstance(data, Mapping):
            raise InvalidRecordError(f"record JSON: {type(data).__name__} is not allowed; send an object")
        try:
            checked = RecordIn.model_validate({k: v for k, v in data.items() if k not in STORE_SET})
        except ValidationError as exc:
            raise invalid("record JSON", exc) from None
        return cls.of(checked)


class _RecordMethods:
    """Record's methods; its fields are RecordIn's and `STORE_SET`."""

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        data["created_at"] = data["created_at"].isoformat()
        data["updated_at"] = data["updated_at"].isoformat()
        return data


#: the fields that name a record, in RecordIn's order: the store keeps one record per key (its unique key, with the
#: shape as its canonical text), and every lookup, tuning key and query names one
KEY_FIELDS: tuple[str, ...] = tuple(
    name for name in PUBLISHED
    if name in {"kernel", "kernel_version", "shape", "dtype", "world_size", "hardware_id", "timing"}
)  # fmt: skip


NewRecord = _dataclass(
    "NewRecord",
    """A tuning result to publish: the key, the winning config and how fast it ran (`RecordIn`'s fields).

    `trials` counts the trials of the study that found this config (all of them, as the tuner keeps it up to
    date). `baseline_us` is the unfused path's latency; the store derives `speedup = baseline_us / latency_p50_us`
    from it. `timing` says how the latency was measured (gpu, eager, graph, or interp: the wall time of Triton's CPU
    interpreter); the store keeps one record per policy.

    Example:
        >>> NewRecord.from_json(record.to_json()) == record.validate()                  # doctest: +SKIP
        True
    """,
    _NewRecordMethods,
    PUBLISHED,
    defaults=True,
)

#: a Record's fields: its id, the published fields, then what the store derives from them and when
RECORD_FIELDS: tuple[str, ...] = (STORE_SET[0], *PUBLISHED, *STORE_SET[1:])

Record = _dataclass(
    "Record",
    "A stored best config for one key (kernel, kernel_version, shape, dtype, world_size, hardware, timing).",
    _RecordMethods,
    RECORD_FIELDS,
    defaults=False,
)


# -- the lookup's answer ----------------------------------------------------------------------------
# Lax (a latency sent as 600 reads as 600.0) and open to fields a newer service adds, so a client can parse
# any service's answer; `timing` defaults to gpu, which is what a service older than timing policies serves.
# The OpenAPI document still lists every field as required in the answer.


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)


def _fields(*names: str, **renamed: str) -> dict[str, Any]:
    """Required fields of these Record fields' types (`renamed`: answer's name -> Record's name)."""
    named = {name: name for name in names} | renamed
    return {new: (FIELD_TYPES[old], ...) for new, old in named.items()}


Latency3 = create_model(
    "Latency3",
    __base__=_Answer,
    __module__=__name__,
    __doc__="The record's latencies in µs: p50, and p10 and p90 where measured.",
    **_fields(p10="latency_p10_us", p50="latency_p50_us", p90="latency_p90_us"),
)

Provenance = create_model(
    "Provenance",
    __base__=_Answer,
    __module__=__name__,
    __doc__="Where the record came from: its study, how many trials, which tuner and Triton, when it was stored.",
    **_fields("study_name", "trials", "tuner_version", "triton_version", "updated_at"),
)


class _LookupAnswer(_Answer):
    @classmethod
    def of(cls, record: Any, distance: float) -> Self:
        """The answer for a stored `record` at `distance` from the asked shape (0: exact). Built without
        validation: the record is the store's; the service checks the answer against this model."""
        values = {name: getattr(record, name) for name in cls.model_fields if name in FIELD_TYPES}
        latency = Latency3.model_construct(p10=record.latency_p10_us, p50=record.latency_p50_us,
                                           p90=record.latency_p90_us)  # fmt: skip
        provenance = Provenance.model_construct(**{name: getattr(record, name) for name in Provenance.model_fields})
        match = "exact" if distance == 0 else "nearest"
        return cls.model_construct(
            **values, latency_us=latency, provenance=provenance, match=match, distance=float(distance)
        )


LookupOut = create_model(
    "LookupOut",
    __base__=_LookupAnswer,
    __module__=__name__,
    __doc__="The config to run for a query, and how close the stored shape is to the asked one.",
    **_fields("id", "kernel", "kernel_version", "shape", "dtype", "world_size", "hardware_id"),
    timing=(FIELD_TYPES["timing"], _default("timing")),
    **_fields("config"),
    latency_us=(Latency3, ...),
    **_fields("baseline_us", "speedup"),
    provenance=(Provenance, ...),
    match=(Literal["exact", "nearest"], ...),
    distance=(float, ...),
)

__all__ = ["FIELD_TYPES", "KEY_FIELDS", "PUBLISHED", "RECORD_FIELDS", "STORE_SET", "Latency3", "LookupOut", "NewRecord",
           "Provenance", "Record"]  # fmt: skip
