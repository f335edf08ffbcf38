"""One record format: every model of a record is derived from `RecordIn`, and the service documents exactly that.

`RecordIn` (db/schema.py) defines the published fields; `NewRecord`, `Record`, `LookupOut` (with `Latency3`
and `Provenance`) are built from it in db/record.py, the store's table holds the same fields, and the
service's OpenAPI document states RecordIn's rules wherever a record's field appears.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from jointtune.db import PUBLISHED, STORE_SET, InvalidRecordError, LookupOut, NewRecord, Record, RecordIn, Store
from jointtune.db._models import RecordRow
from jointtune.db._queries import record_values
from jointtune.db.record import RECORD_FIELDS, Latency3, Provenance
from jointtune.server import Settings, create_app

REF = "#/components/schemas/{model}"
#: what a lookup's answer has beyond a Record's own fields
ANSWER_ONLY = {"latency_us", "provenance", "match", "distance"}


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("openapi") / "service.db"
    return create_app(Settings(db_url=f"sqlite:///{db}")).openapi()


@pytest.fixture(scope="module")
def schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    return openapi["components"]["schemas"]


def _stored(field: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its default: a stored record or an answer always has every field."""
    return {key: value for key, value in field.items() if key != "default"}


def _untitled(field: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in _stored(field).items() if key != "title"}


def _nullable(field: dict[str, Any]) -> bool:
    return {"type": "null"} in field.get("anyOf", [])


def _value_schema(field: dict[str, Any]) -> dict[str, Any]:
    """The non-null member of a nullable field's schema (the field's schema otherwise)."""
    members = [member for member in field.get("anyOf", [field]) if member != {"type": "null"}]
    assert len(members) == 1, field
    return members[0]


# -- the OpenAPI document --------------------------------------------------------------------------


def _without_null_default(field: dict[str, Any]) -> dict[str, Any]:
    """FastAPI writes its document without null values, so `"default": null` is not in it."""
    return {key: value for key, value in field.items() if not (key == "default" and value is None)}


def test_record_in_component_is_the_schema(schemas: dict[str, Any]) -> None:
    own = RecordIn.model_json_schema(ref_template=REF)
    assert list(schemas["RecordIn"]["properties"]) == list(PUBLISHED)
    assert schemas["RecordIn"]["properties"] == {
        name: _without_null_default(field) for name, field in own["properties"].items()
    }
    assert schemas["RecordIn"]["required"] == own["required"]


def test_record_component_is_record_in_plus_what_the_store_sets(schemas: dict[str, Any]) -> None:
    record = schemas["Record"]
    assert list(record["properties"]) == list(RECORD_FIELDS)
    assert set(record["properties"]) == set(PUBLISHED) | set(STORE_SET)
    assert record["required"] == list(RECORD_FIELDS)  # a stored record has every field
    for name in PUBLISHED:  # the same types, limits and patterns as what a publish may send
        assert _stored(record["properties"][name]) == _stored(schemas["RecordIn"]["properties"][name]), name
    assert record["properties"]["id"]["minimum"] == 1 and record["properties"]["id"]["type"] == "integer"


def test_lookup_answer_fields_are_record_fields(schemas: dict[str, Any]) -> None:
    record = schemas["Record"]["properties"]
    answer = schemas["LookupOut"]["properties"]
    assert set(answer) - set(record) == ANSWER_ONLY
    for name in set(answer) & set(record):
        assert _stored(answer[name]) == _stored(record[name]), name
    assert schemas["LookupOut"]["required"] == list(answer)  # timing too, though a client defaults it
    assert answer["latency_us"] == {"$ref": "#/components/schemas/Latency3"}
    assert answer["provenance"] == {"$ref": "#/components/schemas/Provenance"}
    provenance = schemas["Provenance"]["properties"]
    assert set(provenance) <= set(record)
    for name in provenance:
        assert _stored(provenance[name]) == _stored(record[name]), name
    latency = schemas["Latency3"]["properties"]
    assert list(latency) == ["p10", "p50", "p90"]
    for short in latency:
        assert _untitled(latency[short]) == _untitled(record[f"latency_{short}_us"]), short


def test_every_record_the_service_takes_or_gives_is_one_of_these(openapi: dict[str, Any]) -> None:
    def body(method: str, path: str) -> dict[str, Any]:
        return openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]

    def answer(method: str, path: str) -> dict[str, Any]:
        return openapi["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]

    schemas = openapi["components"]["schemas"]
    assert body("post", "/v1/configs") == {"$ref": "#/components/schemas/RecordIn"}
    assert schemas["BundleIn"]["properties"]["records"]["items"] == {"$ref": "#/components/schemas/RecordIn"}
    assert schemas["BundleOut"]["properties"]["records"]["items"] == {"$ref": "#/components/schemas/RecordIn"}
    assert answer("get", "/v1/configs/{kernel}") == {"$ref": "#/components/schemas/LookupOut"}
    assert answer("get", "/v1/records/{record_id}") == {"$ref": "#/components/schemas/Record"}
    assert schemas["PublishOut"]["properties"]["record"] == {"$ref": "#/components/schemas/Record"}
    assert schemas["RecordPage"]["properties"]["items"]["items"] == {"$ref": "#/components/schemas/Record"}


# -- the Python values and the table ---------------------------------------------------------------


def test_new_record_has_record_in_fields_and_defaults() -> None:
    fields = dataclasses.fields(NewRecord)
    assert tuple(f.name for f in fields) == PUBLISHED == tuple(RecordIn.model_fields)
    for f in fields:
        model_field = RecordIn.model_fields[f.name]
        if model_field.is_required():
            assert f.default is dataclasses.MISSING, f.name
        else:
            assert f.default == model_field.default, f.name
        assert f.kw_only and f.default_factory is dataclasses.MISSING
    assert NewRecord.__dataclass_params__.frozen and NewRecord.__module__ == "jointtune.db.record"


def test_a_record_built_from_a_checked_body_is_not_checked_again(
    make_record: Callable[..., NewRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a REST publish: the route validates the body as RecordIn, the store takes NewRecord.of(body)
    body = RecordIn.model_validate(make_record(dtype="bf16", shape={"N": 4096, "M": 8192, "K": 12288}).to_json())
    checked = NewRecord.of(body)
    calls = []
    real = RecordIn.model_validate
    monkeypatch.setattr(RecordIn, "model_validate", lambda data: calls.append(1) or real(data))
    assert checked.validate() is checked and calls == []
    assert checked == make_record(shape={"K": 12288, "M": 8192, "N": 4096}) and "_checked" not in checked.to_json()
    # anything built another way, or changed since, is checked: a bad value is still refused
    changed = dataclasses.replace(checked, world_size=0)
    with pytest.raises(InvalidRecordError, match="world_size"):
        changed.validate()
    assert calls == [1]


def test_record_is_record_in_plus_what_the_store_sets() -> None:
    fields = dataclasses.fields(Record)
    assert tuple(f.name for f in fields) == RECORD_FIELDS == (STORE_SET[0], *PUBLISHED, *STORE_SET[1:])
    assert all(f.default is dataclasses.MISSING and f.kw_only for f in fields)
    assert set(STORE_SET) == {"id", "shape_key", "config_hash", "speedup", "created_at", "updated_at"}
    assert Record.__dataclass_params__.frozen and Record.__module__ == "jointtune.db.record"


_PYTHON_TYPES = {"integer": int, "number": float, "string": str}


def test_record_row_holds_exactly_a_record(schemas: dict[str, Any]) -> None:
    """The table is written by hand (migrations need stable columns), so check it against the schema:
    one column per Record field (plus dims_signature), nullable where the field is, typed as it is, and
    each text column exactly as long as the longest value the schema allows."""
    columns = RecordRow.__table__.columns
    assert set(columns.keys()) == set(RECORD_FIELDS) | {"dims_signature"}
    properties = schemas["Record"]["properties"]
    for name in RECORD_FIELDS:
        column, field = columns[name], properties[name]
        assert column.nullable == _nullable(field), name
        value = _value_schema(field)
        if value.get("format") == "date-time":
            assert column.type.python_type is datetime, name
            continue
        if value["type"] == "object":
            assert isinstance(column.type, sa.JSON), name
            continue
        assert column.type.python_type is _PYTHON_TYPES[value["type"]], name
        if isinstance(column.type, sa.String):
            longest = value.get("maxLength") or max((len(v) for v in value.get("enum", ())), default=None)
            if name in PUBLISHED:
                assert column.type.length == value.get("maxLength", column.type.length), name
            assert longest is None or longest <= column.type.length, name


def test_record_values_fill_every_column_but_the_id(make_record: Callable[..., NewRecord]) -> None:
    row = record_values(make_record().validate(), datetime.now(timezone.utc))
    assert set(row) == set(RecordRow.__table__.columns.keys()) - {"id"}


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        yield store


def test_lookup_answer_is_built_from_a_stored_record(
    sqlite_store: Store, make_record: Callable[..., NewRecord]
) -> None:
    record, _ = sqlite_store.upsert_record(make_record(config={"BLOCK_M": 128.0, "mode": "pull"}))
    answer = LookupOut.of(record, 0.0)
    data = answer.model_dump(mode="json")
    assert LookupOut.model_validate(data) == LookupOut.model_validate(answer.model_dump())
    assert data["match"] == "exact" and data["distance"] == 0.0 and data["timing"] == "gpu"
    assert data["latency_us"] == {"p10": 590.0, "p50": 600.0, "p90": 620.0}
    assert data["provenance"]["study_name"] == "ag_gemm-8192" and data["provenance"]["triton_version"] == "3.6"
    assert data["id"] == record.id and data["config"] == record.config and data["speedup"] == record.speedup
    assert LookupOut.of(record, 1.0).match == "nearest"
    assert isinstance(answer.latency_us, Latency3) and isinstance(answer.provenance, Provenance)
    older = {key: value for key, value in data.items() if key != "timing"}  # a service older than policies
    assert LookupOut.model_validate({**older, "added_later": 1}).timing == "gpu"
