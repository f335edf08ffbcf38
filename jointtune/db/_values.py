"""The plain values the store takes and returns; callers never see ORM objects or sessions.

`NewRecord` is what a tuner publishes; `Record` is what the store holds (plus id, canonical
`shape_key`, `config_hash`, derived `speedup` and timestamps). All are frozen dataclasses that
round-trip through JSON (`to_json` / `from_json`), which is what the service and bundles send.

Example:
    >>> rec = NewRecord(kernel="ag_gemm", kernel_version="3f2a", space_version="9c1d",
    ...                 shape={"M": 8192, "N": 4096, "K": 12288}, dtype="bfloat16", world_size=2,
    ...                 hardware_id="h200x2-nvl", triton_version="3.6", config={"BLOCK_M": 128},
    ...                 latency_p50_us=610.0, trials=64)
    >>> rec.validate().shape_key
    'K=12288,M=8192,N=4096'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from jointtune import __version__
from jointtune.canonical import shape_key
from jointtune.db.schema import RecordIn, _short, describe, problems_of
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
class NewRecord:
    """A tuning result to publish: the key, the winning config and how fast it ran.

    `trials` counts the trials of the study that found this config. `baseline_us` is the unfused
    path's latency; the store derives `speedup = baseline_us / latency_p50_us` from it.
    """

    kernel: str
    kernel_version: str
    space_version: str
    shape: dict[str, int]
    dtype: str
    world_size: int
    hardware_id: str
    triton_version: str
    config: dict[str, Any]
    latency_p50_us: float
    latency_p10_us: float | None = None
    latency_p90_us: float | None = None
    baseline_us: float | None = None
    trials: int = 0
    #: how the latency was measured: gpu, eager or graph (`schema.TIMINGS`); one record per policy
    timing: str = "gpu"
    study_name: str | None = None
    tuner_version: str = __version__

    @property
    def shape_key(self) -> str:
        return shape_key(self.shape)

    def validate(self) -> NewRecord:
        """This record with canonical values (dtype aliases resolved, dims sorted) if every field is
        allowed by the store's schema (`RecordIn`), else InvalidRecordError naming each bad field."""
        try:
            checked = RecordIn.model_validate(self.to_json())
        except ValidationError as exc:
            raise invalid(f"record for kernel {_short(self.kernel)}", exc) from None
        return NewRecord.of(checked)

    @classmethod
    def of(cls, checked: RecordIn) -> NewRecord:
        """The NewRecord of a record the schema accepted (dims sorted by name)."""
        data = checked.model_dump()
        data["shape"] = dict(sorted(data["shape"].items()))
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NewRecord:
        """Build from JSON and validate; fields only a stored Record has (id, timestamps, ...) are ignored."""
        if not isinstance(data, Mapping):
            raise InvalidRecordError(f"record JSON: {type(data).__name__} is not allowed; send an object")
        try:
            checked = RecordIn.model_validate({k: v for k, v in data.items() if k not in _RECORD_ONLY})
        except ValidationError as exc:
            raise invalid("record JSON", exc) from None
        return cls.of(checked)


_RECORD_ONLY = {"id", "shape_key", "config_hash", "speedup", "created_at", "updated_at"}


@dataclass(frozen=True, kw_only=True)
class Record:
    """A stored best config for one key (kernel, kernel_version, shape, dtype, world_size, hardware, timing)."""

    id: int
    kernel: str
    kernel_version: str
    space_version: str
    shape: dict[str, int]
    shape_key: str
    dtype: str
    world_size: int
    hardware_id: str
    triton_version: str
    config: dict[str, Any]
    config_hash: str
    latency_p10_us: float | None
    latency_p50_us: float
    latency_p90_us: float | None
    baseline_us: float | None
    speedup: float | None
    trials: int
    timing: str
    study_name: str | None
    tuner_version: str
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["created_at"] = self.created_at.isoformat()
        data["updated_at"] = self.updated_at.isoformat()
        return data


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
