"""Request and response bodies; pydantic checks types and names the bad field in every 422.

The store re-checks every record (`NewRecord.validate`), so these models only need to reject what
JSON can't express safely (non-finite floats, unknown fields) and to document the API.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jointtune import __version__
from jointtune.db import Record

#: printable text only: PostgreSQL refuses NUL in text, and control characters only hide typos
TEXT = r"^[^\x00-\x1f\x7f]+$"
#: 1 ns: the smallest latency we accept, so that speedup = baseline / p50 stays finite
MIN_US = 1e-3


def no_nul(value: Any) -> Any:
    """PostgreSQL's JSONB refuses NUL characters: reject them here as bad input, not a 503 later."""
    if "\\u0000" in json.dumps(value):
        raise ValueError("NUL characters (\\u0000) are not allowed in it")
    return value


class RecordIn(BaseModel):
    """A tuning result to publish (the fields of `jointtune.db.NewRecord`)."""

    model_config = ConfigDict(extra="forbid")
    _config_no_nul = field_validator("config")(no_nul)

    kernel: str = Field(min_length=1, max_length=128, pattern=TEXT)
    kernel_version: str = Field(min_length=1, max_length=64, pattern=TEXT)
    space_version: str = Field(min_length=1, max_length=64, pattern=TEXT)
    shape: dict[str, int] = Field(min_length=1, max_length=16)
    dtype: str = Field(min_length=1, max_length=32, pattern=TEXT)
    world_size: int = Field(ge=1, le=1_000_000)
    hardware_id: str = Field(min_length=1, max_length=128, pattern=TEXT)
    triton_version: str = Field(pattern=r"^\d+\.\d+$", max_length=16)
    config: dict[str, Any]
    latency_p50_us: float = Field(ge=MIN_US, le=1e12, allow_inf_nan=False)
    latency_p10_us: float | None = Field(default=None, ge=MIN_US, le=1e12, allow_inf_nan=False)
    latency_p90_us: float | None = Field(default=None, ge=MIN_US, le=1e12, allow_inf_nan=False)
    baseline_us: float | None = Field(default=None, ge=MIN_US, le=1e12, allow_inf_nan=False)
    trials: int = Field(default=0, ge=0, le=2**31 - 1)
    study_name: str | None = Field(default=None, max_length=256, pattern=TEXT)
    tuner_version: str = Field(default=__version__, min_length=1, max_length=32, pattern=TEXT)


class Latency3(BaseModel):
    p10: float | None
    p50: float
    p90: float | None


class Provenance(BaseModel):
    study_name: str | None
    trials: int
    tuner_version: str
    triton_version: str
    updated_at: datetime


class LookupOut(BaseModel):
    """The config to run for a query, and how close the stored shape is to the asked one."""

    id: int
    kernel: str
    kernel_version: str
    shape: dict[str, int]
    dtype: str
    world_size: int
    hardware_id: str
    config: dict[str, Any]
    latency_us: Latency3
    baseline_us: float | None
    speedup: float | None
    provenance: Provenance
    match: Literal["exact", "nearest"]
    distance: float


class PublishOut(BaseModel):
    record: Record  # the store's own value type: one definition of a record's fields
    changed: bool


class RecordPage(BaseModel):
    total: int
    limit: int
    offset: int
    items: list[Record]


class KernelOut(BaseModel):
    name: str
    version: str
    created_at: datetime


class HardwareIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hardware_id: str = Field(min_length=1, max_length=128, pattern=TEXT)
    name: str = Field(min_length=1, max_length=256, pattern=TEXT)
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    _fingerprint_no_nul = field_validator("fingerprint")(no_nul)


class HardwareOut(HardwareIn):
    created_at: datetime | None = None


class BundleIn(BaseModel):
    """One hardware profile and its records, as `GET /v1/bundles/{hardware_id}` exports them."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    hardware: HardwareIn
    records: list[RecordIn] = Field(max_length=100_000)
    exported_at: datetime | None = None
    tuner_version: str | None = None


class ImportOut(BaseModel):
    hardware_id: str
    records: int
    changed: int
    unchanged: int
