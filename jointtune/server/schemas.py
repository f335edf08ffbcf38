"""Request and response bodies, and the error bodies every route documents.

Requests are the store's own schema (`jointtune.db.RecordIn`, `HardwareIn`): one definition of what
a record may hold, so a body the service accepts is one the store accepts and can serve back. The
records it answers are the store's own types too, built from that schema (`Record`, and `LookupOut`
for a lookup, in `jointtune.db.record`). The other responses are documented with the models here,
and every status code a route can answer is listed with its body (`responses`), so the OpenAPI
document says what the service does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jointtune.db import HardwareIn, Record, RecordIn
from jointtune.db.schema import EQUAL, Integral

SCHEMA_VERSION = 1


class Problem(BaseModel):
    """One reason a request was refused: where (`loc`, e.g. ["body", "shape", "M"]), what and its kind."""

    loc: list[int | str]
    msg: str
    type: str


class Invalid(BaseModel):
    """422: the request is well-formed HTTP but its parameters or body are not allowed."""

    detail: list[Problem]


class Message(BaseModel):
    """Every other error: one sentence that names what was wrong and what is allowed."""

    detail: str


class PublishOut(BaseModel):
    record: Record  # the store's own value type, built from RecordIn
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


class HardwareOut(BaseModel):
    hardware_id: str
    name: str
    fingerprint: dict[str, Any]
    created_at: datetime


class BundleIn(BaseModel):
    """One hardware profile and its records: a page of `GET /v1/bundles/{hardware_id}` as it was
    served, or a file of `jointtune export`. Every record must be of the bundle's hardware (the schema's
    `x-jointtune-equal`)."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        json_schema_extra={EQUAL: ["/hardware/hardware_id", "/records/*/hardware_id"]},
    )

    schema_version: Annotated[Literal[1], Integral]
    hardware: HardwareIn
    records: list[RecordIn]
    exported_at: str | None = Field(default=None, max_length=64)
    tuner_version: str | None = Field(default=None, max_length=32)
    next_after: Annotated[int, Field(ge=0), Integral] | None = Field(
        default=None, description="ignored: a page's cursor"
    )

    @model_validator(mode="after")
    def _one_hardware(self) -> BundleIn:
        hardware_id = self.hardware.hardware_id
        for index, record in enumerate(self.records):
            if record.hardware_id != hardware_id:
                raise PydanticCustomError(
                    "bundle_hardware",
                    f"records[{index}].hardware_id: {record.hardware_id!r} is not allowed; "
                    f"it must be the bundle's {hardware_id!r}",
                )
        return self


class BundleOut(BaseModel):
    """A page of one hardware's records, itself a bundle `POST /v1/bundles` takes as it is.

    Pages are cut by record count (`limit`) and by size, so each fits the service's request body
    limit; `next_after` is the `after` of the next page, null on the last one."""

    schema_version: Literal[1]
    tuner_version: str
    exported_at: str
    hardware: HardwareIn
    next_after: int | None
    records: list[RecordIn]


class ImportOut(BaseModel):
    hardware_id: str
    records: int
    changed: int
    unchanged: int


class ReadyOut(BaseModel):
    status: Literal["ready", "unavailable"]
    backend: str | None = None
    revision: str | None = None
    detail: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok"]


_AUTH_HEADER = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
_DESCRIPTIONS: dict[int, tuple[type[BaseModel], str, dict[str, Any] | None]] = {
    401: (Message, "No bearer token where the route needs one, or a token that is not valid", _AUTH_HEADER),
    403: (Message, "The token's role may not do this (writes need write, deletes admin)", None),
    404: (Message, "Nothing stored matches; the message says what the store does have", None),
    413: (Message, "The request body is larger than the service's limit (JOINTTUNE_BODY_LIMIT_BYTES)", None),
    422: (Invalid, "Parameters or body not allowed: each item names the field and what is allowed", None),
    429: (
        Message,
        "Too many reads of this kind at once in this worker (exports: JOINTTUNE_EXPORT_CONCURRENCY; listings and "
        "dashboard pages: JOINTTUNE_LIST_CONCURRENCY); retry after Retry-After seconds",
        {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}},
    ),
    503: (Message, "The tuning store can't be reached; try again later", None),
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route that can answer `codes` besides its success."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        model, description, headers = _DESCRIPTIONS[code]
        out[code] = {"model": model, "description": description, **({"headers": headers} if headers else {})}
    return out
