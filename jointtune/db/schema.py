"""The one strict schema of what the store accepts: records, lookup keys and hardware profiles.

Defined once here and used by the store (`NewRecord.validate`, the lookup checks), the service (its
request models and parameters are these types, so its OpenAPI document states these rules), the
client (checks a record before sending it) and bundles; `RecordIn` is the record's format, from which
every other model of a record is built (`jointtune.db.record`). The rules exist so that whatever the
store accepts, it can always read back and serve, on SQLite and PostgreSQL alike:

- strict types: no bool -> number, no "2" -> 2, no 2.5 -> 2 (JSON's `true` is not 1 µs; 2.0 is
  JSON Schema's integer 2, so it is taken as 2);
- finite numbers, latencies in [MIN_US, MAX_US] µs, dims in [1, MAX_DIM] (PostgreSQL's double
  precision takes them, where 10**309 broke every nearest lookup of its group);
- names (kernel, kernel_version, space_version, hardware_id) of `NAME_CHARS`, so every stored id
  fits in a URL path segment and in HTML as it is (no "/", no markup, no "." or ".." segments);
- dim names are identifiers other than the lookup's own query parameters (`RESERVED_DIM_NAMES`);
- dtypes from one vocabulary (`jointtune.dtypes`), aliases such as `bf16` stored under torch's name;
- config and fingerprint: JSON objects at most MAX_JSON_DEPTH levels deep, MAX_JSON_ITEMS entries per
  level, MAX_JSON_BYTES in all, valid Unicode (no lone surrogates) and no NUL (PostgreSQL refuses it).

Each type carries its JSON Schema (`WithJsonSchema`) beside its check, so the OpenAPI document states
exactly what is accepted. Longer than our usual module because it is the one place every rule lives.

Example:
    >>> RecordIn.model_validate({**fields, "dtype": "bf16"}).dtype                  # doctest: +SKIP
    'bfloat16'
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from jointtune._version import __version__
from jointtune.canonical import MAX_DIM
from jointtune.dtypes import DTYPE_ALIASES, TORCH_DTYPES, canonical_dtype
from jointtune.timings import TIMINGS

#: a name: letters, digits and `_ . : -`, starting with a letter, digit or `_`
NAME_CHARS = "A-Z a-z 0-9 _ . : - (starting with a letter, digit or _)"
NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$"
#: dim names are identifiers (they travel as query parameter names)
DIM_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,31}$"
#: the lookup's own query parameters, which can't also be dim names
RESERVED_DIM_NAMES = ("dtype", "world_size", "hardware_id", "kernel_version", "nearest", "timing")
MAX_DIMS = 8
MAX_WORLD_SIZE = 1_000_000
#: 1 ns .. 11.6 days; speedup = baseline / p50 stays finite
MIN_US, MAX_US = 1e-3, 1e12
#: PostgreSQL's integer columns (record ids, trials)
MAX_INT32 = 2**31 - 1
MAX_JSON_DEPTH = 3
MAX_JSON_ITEMS = 64
MAX_JSON_KEY = 128
MAX_JSON_STR = 1024
MAX_JSON_BYTES = 64 * 1024
NO_NUL_RE = r"^[^\x00]*$"
TEXT_RE = r"^[^\x00-\x1f\x7f]+$"
VERSION_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"
TRITON_RE = r"^[0-9]{1,4}\.[0-9]{1,4}$"

_ONE = "(?:" + "|".join(sorted(TORCH_DTYPES, key=len, reverse=True)) + ")"
_EXTRA = r"[A-Za-z0-9_.,=:'+-]+"
#: one dtype (torch name, `torch.` name or alias), or the Triton drop-in's dtype text: the key's tensor
#: dtypes joined by "+" (or "none"), optionally ";" and its other key values, or "sha:" and a hash
DTYPE_RE = (
    rf"^(?:torch\.{_ONE}|{'|'.join(DTYPE_ALIASES)}|(?:{_ONE}|none)(?:\+{_ONE})*(?:;{_EXTRA})?|sha:[0-9a-f]{{28}})$"
)
MAX_DTYPE = 32
_NAME, _DIM_NAME, _DTYPE, _TRITON = (re.compile(p) for p in (NAME_RE, DIM_NAME_RE, DTYPE_RE, TRITON_RE))


def _error(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise _error("name", f"use {NAME_CHARS}")
    return value


def name(max_length: int) -> Any:
    """A name type of at most `max_length` characters (kernel, versions, hardware_id)."""
    schema = {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": NAME_RE}
    return Annotated[
        str, StringConstraints(min_length=1, max_length=max_length), AfterValidator(_check_name), WithJsonSchema(schema)
    ]


def _canonical_dtype(value: Any) -> Any:
    return (canonical_dtype(value) or value) if isinstance(value, str) else value


def _check_dtype(value: str) -> str:
    if not _DTYPE.match(value):
        raise _error(
            "dtype",
            f"use a torch dtype name ({', '.join(TORCH_DTYPES[:4])}, ...) or an alias ({', '.join(DTYPE_ALIASES)})",
        )
    return value


def is_dtype(text: str) -> bool:
    """Whether the store takes `text` as a dtype as it is (a name, an alias or the Triton drop-in's text)."""
    return len(text) <= MAX_DTYPE and _DTYPE.match(text) is not None


def _check_dim_name(value: str) -> str:
    if not _DIM_NAME.match(value):
        raise _error("dim_name", "use an identifier of <= 32 characters like 'M'")
    if value in RESERVED_DIM_NAMES:
        raise _error("dim_name", f"{', '.join(RESERVED_DIM_NAMES)} are lookup parameters, not dim names")
    return value


def _integral(value: Any) -> Any:
    """JSON Schema's integers include 3.0: take an integral float as that integer (never a bool or a
    string, and never 3.5), so the service accepts exactly what its OpenAPI document describes."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _check_triton(value: str) -> str:
    if not _TRITON.match(value):
        raise _error("triton_version", "use major.minor like '3.6'")
    return value


def _utf8(value: Any) -> Any:
    """Valid Unicode (no lone surrogates) and at most MAX_JSON_BYTES as compact UTF-8 JSON."""
    try:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())
    except UnicodeEncodeError:
        raise _error("unicode", "it holds a lone surrogate; send valid Unicode text") from None
    if size > MAX_JSON_BYTES:
        raise _error("too_large", f"{size} bytes of JSON; at most {MAX_JSON_BYTES} are allowed")
    return value


Name128, Name64 = name(128), name(64)
Dtype = Annotated[
    str,
    BeforeValidator(_canonical_dtype),
    StringConstraints(min_length=1, max_length=MAX_DTYPE),
    AfterValidator(_check_dtype),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_DTYPE, "pattern": DTYPE_RE}),
]
DimName = Annotated[str, AfterValidator(_check_dim_name)]
Integral = BeforeValidator(_integral)
Dim = Annotated[int, Field(ge=1, le=MAX_DIM), Integral]
SHAPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "maxProperties": MAX_DIMS,
    "propertyNames": {"pattern": DIM_NAME_RE, "not": {"enum": list(RESERVED_DIM_NAMES)}},
    "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_DIM},
    "description": f"dim name -> size; names are identifiers other than {', '.join(RESERVED_DIM_NAMES)}",
}
Shape = Annotated[dict[DimName, Dim], Field(min_length=1, max_length=MAX_DIMS), WithJsonSchema(SHAPE_SCHEMA)]
WorldSize = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE), Integral]
Latency = Annotated[float, Field(ge=MIN_US, le=MAX_US, allow_inf_nan=False)]
TritonVersion = Annotated[
    str,
    StringConstraints(max_length=16),
    AfterValidator(_check_triton),
    WithJsonSchema({"type": "string", "maxLength": 16, "pattern": TRITON_RE}),
]
Text256 = Annotated[str, StringConstraints(max_length=256, pattern=TEXT_RE), AfterValidator(_utf8)]
RecordId = Annotated[int, Field(ge=1, le=MAX_INT32), Integral]

_Key = Annotated[str, StringConstraints(max_length=MAX_JSON_KEY, pattern=NO_NUL_RE)]
_KINDS = {type(None): "<null>", bool: "<bool>", int: "<int>", float: "<float>", str: "<str>", list: "<array>",
          dict: "<object>"}  # fmt: skip


def _kind(value: Any) -> str:
    """The JSON kind of `value`; subclasses count as their base (torch's version is a `str` subclass)."""
    kind = _KINDS.get(type(value))
    if kind is not None:
        return kind
    for base in (bool, int, float, str, list, dict):
        if isinstance(value, base):
            return _KINDS[base]
    return "<other>"


def _json_value(inner: Any | None) -> Any:
    """A JSON value; arrays and objects of `inner` values unless `inner` is None (the deepest level).

    A union picked by the value's type (a tagged union), so an error names one path and one rule
    instead of one line per possible type."""
    members: list[Any] = [
        Annotated[None, Tag("<null>")],
        Annotated[bool, Tag("<bool>")],
        Annotated[int, Tag("<int>")],  # any size JSON has (the 64 KiB bound and Python's 4300 digits hold it)
        Annotated[float, Field(allow_inf_nan=False), Tag("<float>")],
        Annotated[str, StringConstraints(max_length=MAX_JSON_STR, pattern=NO_NUL_RE), Tag("<str>")],
    ]
    if inner is not None:
        members.append(Annotated[list[inner], Field(max_length=MAX_JSON_ITEMS), Tag("<array>")])
        members.append(Annotated[dict[_Key, inner], Field(max_length=MAX_JSON_ITEMS), Tag("<object>")])
    message = (
        f"use null, true/false, a finite number, a string of <= {MAX_JSON_STR} characters, or arrays and "
        f"objects nested at most {MAX_JSON_DEPTH} levels deep (counting the outermost object)"
    )
    plain = Union[tuple(members)]  # noqa: UP007
    return Annotated[
        plain,
        Discriminator(_kind, custom_error_type="json_value", custom_error_message=message),
        WithJsonSchema(_closed(TypeAdapter(plain).json_schema())),
    ]


def _closed(schema: Any) -> Any:
    """pydantic states a constrained dict key as `patternProperties`, which leaves other keys open;
    state it as `propertyNames` + `additionalProperties`, which is what the validator does."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed(value) for key, value in schema.items()}
    patterns = out.pop("patternProperties", None)
    if patterns:
        ((pattern, values),) = patterns.items()
        out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
        out["additionalProperties"] = values
    return out


_DESCRIBED = (
    f"a JSON object: at most {MAX_JSON_DEPTH} levels of objects/arrays, {MAX_JSON_ITEMS} entries each, "
    f"{MAX_JSON_BYTES} bytes as compact UTF-8 JSON; finite numbers, valid Unicode, no NUL"
)
#: a JSON object of at most MAX_JSON_DEPTH levels (itself, then two more), each of <= MAX_JSON_ITEMS entries
_value: Any = None
for _ in range(MAX_JSON_DEPTH):
    _value = _json_value(_value)
_OBJECT_SCHEMA = {**TypeAdapter(dict[_Key, _value]).json_schema(), "maxProperties": MAX_JSON_ITEMS}
JsonObject = Annotated[
    dict[_Key, _value],
    Field(max_length=MAX_JSON_ITEMS),
    AfterValidator(_utf8),
    WithJsonSchema(_closed({**_OBJECT_SCHEMA, "description": _DESCRIBED})),
]


#: how a record's latency was measured: one of `jointtune.timings.TIMINGS` (the tuner's policies: GPU time
#: behind a hold, wall time of calls issued back to back, replays of a captured CUDA graph, or the wall time of
#: Triton's CPU interpreter); records made before policies existed are gpu
Timing = Annotated[
    Literal[TIMINGS],
    WithJsonSchema({"type": "string", "enum": list(TIMINGS), "description": "how the latency was measured"}),
]


#: Rules across fields, which JSON Schema can't state, stated beside it in the schema of the object they bind:
#: `x-jointtune-ordered` lists properties that, where given (not null), never decrease in that order;
#: `x-jointtune-equal` lists JSON pointers (`*`: every item of an array) whose values are all equal. A client
#: or a test generator reads them from the OpenAPI document to build bodies the service takes.
ORDERED = "x-jointtune-ordered"
EQUAL = "x-jointtune-equal"
#: a record's latencies, in the order they may not decrease
LATENCY_ORDER = ("latency_p10_us", "latency_p50_us", "latency_p90_us")


# The one definition of a record's published fields: names, order, types, limits and defaults are declared
# here only; `jointtune.db.record` builds NewRecord, Record and the lookup's answer from them. Each rule lives
# in a field's Annotated type (never in `= Field(...)`, which the built types would not carry), and
# tests/db/test_db_record.py checks that the OpenAPI document states the same rules for every model.
class RecordIn(BaseModel):
    """A tuning result to publish, checked strictly.

    `latency_p10_us <= latency_p50_us <= latency_p90_us` where given (the schema's `x-jointtune-ordered`); the
    store derives `speedup`.
    """

    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, json_schema_extra={ORDERED: list(LATENCY_ORDER)}
    )

    kernel: Name128
    kernel_version: Name64
    space_version: Name64
    shape: Shape
    dtype: Dtype
    world_size: WorldSize
    hardware_id: Name128
    triton_version: TritonVersion
    config: JsonObject
    latency_p50_us: Latency
    latency_p10_us: Latency | None = None
    latency_p90_us: Latency | None = None
    baseline_us: Latency | None = None
    trials: Annotated[int, Field(ge=0, le=MAX_INT32), Integral] = 0
    timing: Timing = "gpu"
    study_name: Text256 | None = None
    tuner_version: Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=VERSION_RE)] = __version__

    @model_validator(mode="after")
    def _ordered(self) -> RecordIn:
        p10, p50, p90 = (getattr(self, name) for name in LATENCY_ORDER)
        given = [value for value in (p10, p50, p90) if value is not None]
        if given != sorted(given):
            raise _error("latency_order", f"p10={p10}, p50={p50}, p90={p90} must satisfy p10 <= p50 <= p90")
        return self

    @model_validator(mode="after")
    def _fits_space(self) -> RecordIn:
        # A record of a registered family at its current space version must be a config that space takes: the
        # store keeps one record per key, so a config no kernel runs would shadow every valid one published later
        # (records of older space versions are kept as they are: their rules are gone).
        from jointtune.errors import SpaceError
        from jointtune.search_spaces import Problem, get_space, space_names

        if self.kernel not in space_names():
            return self
        space = get_space(self.kernel)
        if self.space_version != space.version:
            return self
        try:
            problem = Problem.of(self.shape, dtype=self.dtype, world_size=self.world_size)
            space.check_record(self.config, problem)
        except SpaceError as exc:
            raise _error(
                "space", f"config: the {self.kernel} space (version {space.version}) refuses this record: {exc}"
            ) from None
        return self


class HardwareIn(BaseModel):
    """A hardware profile: its id, a readable name and its fingerprint."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    hardware_id: Name128
    name: Text256
    fingerprint: JsonObject = Field(default_factory=dict)


def error_loc(parts: Any) -> list[int | str]:
    """A pydantic error location without the JSON-kind tags of config values ("<object>", ...), its keys
    shortened and made valid Unicode (a key may be the very lone surrogate being refused)."""
    return [part if isinstance(part, int) else printable(str(part), 64) for part in parts if str(part) not in _TAGS]


def printable(text: str, limit: int = 200) -> str:
    """`text` as valid Unicode (lone surrogates escaped) of at most `limit` characters: safe to answer."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TAGS = frozenset(_KINDS.values())


def problems_of(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors as the service's 422 items: {loc, msg, type}, without echoing the input."""
    return [
        {"loc": error_loc(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in exc.errors(include_url=False)
    ]


def describe(exc: ValidationError, *, limit: int = 10) -> str:
    """One line naming each bad field, its value (shortened) and what is allowed."""
    parts = []
    for err in exc.errors(include_url=False)[:limit]:
        loc = error_loc(err["loc"])
        if not loc:  # a rule over several fields: its message names them
            parts.append(err["msg"])
            continue
        got = "" if err["type"] == "missing" else f"{_short(err.get('input'))} is not allowed; "
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
        parts.append(f"{where}: {got}{err['msg']}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    return printable(repr(value), 80)
