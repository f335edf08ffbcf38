"""The store's one schema, on SQLite and PostgreSQL: what it refuses is never written, what it takes
it serves back (issue 17: items 1, 2, 4, 5, 6, 9 at the store, and all-or-nothing imports)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from jointtune.db import InvalidRecordError, NewRecord, RecordKey, Store
from jointtune.db.schema import MAX_DIM, MAX_JSON_BYTES, RecordIn
from jointtune.errors import StoreError

MakeRecord = Callable[..., NewRecord]
KEY = {"kernel": "ag_gemm", "kernel_version": "v1", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"config": _nested(300)}, "config.x.x.x"),  # item 1: saved, then unreadable
        ({"config": {"mode": "\ud800"}}, "config.mode"),  # item 1: a lone surrogate
        ({"config": {str(k): "x" * 1024 for k in range(64)}}, "config"),  # over MAX_JSON_BYTES
        ({"shape": {"M": 10**309, "N": 64, "K": 64}}, "shape.M"),  # item 2: beyond double precision
        ({"shape": {"M": MAX_DIM + 1}}, "shape.M"),
        ({"latency_p50_us": True}, "latency_p50_us"),  # item 4: no bool -> number
        ({"shape": {"M": True}}, "shape.M"),
        ({"world_size": "2"}, "world_size"),  # item 4: no str -> int
        ({"trials": 2.5}, "trials"),
        ({"kernel": "ag/gemm"}, "kernel"),  # item 6: a name no URL path reaches
        ({"hardware_id": "<b>h200</b>"}, "hardware_id"),  # item 6: markup
        ({"kernel_version": ".."}, "kernel_version"),
        ({"dtype": "bfloat17"}, "dtype"),  # item 9: not a dtype
        ({"shape": {"dtype": 4}}, "shape.dtype"),  # a dim the lookup's query could never name
    ],
)
def test_refused_records_are_never_written(store: Store, make_record: MakeRecord, override: dict, field: str) -> None:
    with pytest.raises(InvalidRecordError, match=f"{field}.*is not allowed") as info:
        store.upsert_record(make_record(**override))
    assert info.value.problems and all(p["loc"] for p in info.value.problems)
    json.dumps(info.value.problems, ensure_ascii=False).encode()  # the 422 body can always be sent
    assert store.count_records() == 0 and store.list_kernels() == []


def test_what_the_store_takes_it_serves_back(store: Store, make_record: MakeRecord) -> None:
    config = {"mode": "push", "chunks": [1, 2.5, None, True, "ü"], "nested": {"a": [1, {"b": 2}][:1], "c": {"d": 1}}}
    big = {f"k{i}": "é" * 400 for i in range(40)}  # multi-byte text, under 64 KiB
    assert len(json.dumps(big, ensure_ascii=False).encode()) < MAX_JSON_BYTES
    edge = make_record(kernel="a.b:c-d_e", shape={"M": MAX_DIM, "N": 1, "K": 64}, config=config, study_name="ü ✓")
    stored, _ = store.upsert_record(edge)
    store.upsert_record(make_record(shape={"M": 8, "N": 1, "K": 64}, config=big))
    assert store.get_record(stored.id) == stored
    json.dumps([r.to_json() for r in store.list_records()], ensure_ascii=False, allow_nan=False).encode()
    # item 2: the largest dim keeps every nearest lookup of its group working (PostgreSQL: double precision)
    near = store.nearest(RecordKey(**{**KEY, "kernel": "a.b:c-d_e"}, shape={"M": 4096, "N": 1, "K": 64}), limit=5)
    assert [r.id for r, _ in near] == [stored.id]
    ((first, _),) = store.nearest(RecordKey(**KEY, shape={"M": 8, "N": 1, "K": 64}))
    assert first.config == big


def test_lookups_take_the_cli_dtype_names_and_refuse_unknown_ones(store: Store, make_record: MakeRecord) -> None:
    record, _ = store.upsert_record(make_record(dtype="bf16"))  # stored under torch's name
    assert record.dtype == "bfloat16"
    for name in ("bf16", "bfloat16", "torch.bfloat16"):
        assert store.best(RecordKey(**{**KEY, "dtype": name}, shape=record.shape)) == record
    assert store.count_records(RecordKey.any(dtype="bf16")) == 1
    with pytest.raises(InvalidRecordError, match="dtype: 'bfloat17' is not allowed"):
        store.best(RecordKey(**{**KEY, "dtype": "bfloat17"}, shape=record.shape))


def test_ids_beyond_the_integer_column_are_absent_not_errors(store: Store, make_record: MakeRecord) -> None:
    record, _ = store.upsert_record(make_record())
    for record_id in (2**31, 2**63, -1, 0):  # item 5: PostgreSQL answered "out of range" (a 503)
        assert store.get_record(record_id) is None
        assert store.delete_record(record_id) is False
    assert store.get_record(record.id) == record


def test_infinity_in_a_fingerprint_is_refused_not_nulled(store: Store) -> None:
    with pytest.raises(InvalidRecordError, match=r"fingerprint\.sms: inf is not allowed"):
        store.upsert_hardware(hardware_id="h1", name="h1", fingerprint={"sms": float("inf")})
    assert store.list_hardware() == []


def test_strictness_is_the_schemas_not_the_callers() -> None:
    """The service, the client and bundles validate with RecordIn itself: the same answers."""
    base = NewRecord(**{**_fields(), "world_size": 2}).to_json()
    assert RecordIn.model_validate(base).world_size == 2
    assert RecordIn.model_validate({**base, "world_size": 2.0}).world_size == 2  # JSON Schema's integer
    for bad in ({"world_size": "2"}, {"world_size": True}, {"latency_p50_us": "600"}, {"colour": "blue"}):
        with pytest.raises(ValueError):
            RecordIn.model_validate({**base, **bad})


def _fields() -> dict[str, Any]:
    names = {"kernel": "ag_gemm", "kernel_version": "v1", "space_version": "s1", "hardware_id": "h"}
    return {**names, "shape": {"M": 8}, "dtype": "bf16", "world_size": 2, "triton_version": "3.6", "config": {},
            "latency_p50_us": 600.0}  # fmt: skip


def _fail_on_marker(store: Store) -> None:
    """A real database trigger that aborts the insert of a record whose study_name is 'boom'."""
    with store.engine.begin() as conn:
        if store.backend == "sqlite":
            conn.exec_driver_sql("CREATE TRIGGER boom BEFORE INSERT ON jt_records WHEN NEW.study_name = 'boom' "
                                 "BEGIN SELECT RAISE(ABORT, 'boom'); END")  # fmt: skip
        else:
            body = "BEGIN IF NEW.study_name = 'boom' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END"
            conn.exec_driver_sql(f"CREATE FUNCTION boom() RETURNS trigger AS $$ {body} $$ LANGUAGE plpgsql")
            conn.exec_driver_sql("CREATE TRIGGER boom BEFORE INSERT ON jt_records FOR EACH ROW EXECUTE FUNCTION boom()")


def test_an_import_is_all_or_nothing(store: Store, make_record: MakeRecord) -> None:
    """Item 8: a failure on the 999th of 1000 records (here the database's own) leaves the store as it was."""
    kept, _ = store.upsert_record(make_record(shape={"M": 1, "N": 1, "K": 1}, latency_p50_us=10.0))
    records = [make_record(shape={"M": m, "N": 64, "K": 64}, study_name="ok") for m in range(1, 1001)]
    records[998] = make_record(shape={"M": 999, "N": 64, "K": 64}, study_name="boom")
    _fail_on_marker(store)
    with pytest.raises(StoreError, match="boom"):
        store.import_records(
            records, hardware=[{"hardware_id": "h200x2-nvl", "name": "2x H200", "fingerprint": {"a": 1}}]
        )
    assert [r.id for r in store.list_records()] == [kept.id]
    assert store.get_hardware("h200x2-nvl").fingerprint == {}  # the profile's update went too
    with pytest.raises(InvalidRecordError, match=r"world_size: 0 is not allowed"):  # checked before any write
        store.import_records([make_record(), make_record(world_size=0)])
    assert store.count_records() == 1
    del records[998]
    assert store.import_records(records) == (999, 999)
    assert store.import_records(records) == (999, 0)  # importing twice changes nothing
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jt_records")).scalar() == 1000


def test_a_deleted_records_id_is_never_given_again(store: Store, make_record: MakeRecord) -> None:
    """Found by the fuzzing: SQLite gave a deleted newest record's id to the next record published."""
    store.upsert_record(make_record(shape={"M": 1, "N": 64, "K": 64}))
    newest, _ = store.upsert_record(make_record(shape={"M": 2, "N": 64, "K": 64}))
    assert store.delete_record(newest.id)
    again, _ = store.upsert_record(make_record(shape={"M": 3, "N": 64, "K": 64}))
    assert again.id > newest.id and store.get_record(newest.id) is None


def test_str_and_number_subclasses_count_as_their_json_kind(store: Store) -> None:
    """A GPU fingerprint holds `torch.__version__`, a `str` subclass (TorchVersion): a JSON string, stored as one.
    (The first sweep on 2x H200 after the schema landed was refused on it.)"""
    import torch

    class Count(int):
        pass

    fingerprint = {"torch": torch.__version__, "num_sms": Count(132), "compute_capability": [9, 0]}
    profile = store.upsert_hardware(hardware_id="h200x2-nvl", name="2x H200", fingerprint=fingerprint)
    assert profile.fingerprint == {"torch": str(torch.__version__), "num_sms": 132, "compute_capability": [9, 0]}
    assert type(store.get_hardware("h200x2-nvl").fingerprint["torch"]) is str
