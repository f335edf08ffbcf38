"""The store's plain values: canonical keys, hashes, validation messages and JSON round trips."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from jointtune.db import InvalidRecordError, NewRecord, config_hash, head_revision, shape_key
from jointtune.db._migrate import alembic_config
from jointtune.errors import StoreError


def test_shape_key_sorts_dims_by_name() -> None:
    assert shape_key({"M": 8192, "N": 4096, "K": 12288}) == "K=12288,M=8192,N=4096"
    assert shape_key({"K": 12288, "N": 4096, "M": 8192}) == "K=12288,M=8192,N=4096"


def test_config_hash_ignores_key_order_but_not_values() -> None:
    assert config_hash({"a": 1, "b": "push"}) == config_hash({"b": "push", "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    assert len(config_hash({})) == 16


def test_validate_lists_every_bad_field(make_record: Callable[..., NewRecord]) -> None:
    bad = make_record(kernel="", world_size=-2, latency_p50_us=float("nan"), shape={"M": 0})
    with pytest.raises(InvalidRecordError) as info:
        bad.validate()
    message = str(info.value)
    for part in ("kernel: ''", "world_size: -2", "latency_p50_us: nan", "shape.M: 0"):
        assert part in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, StoreError)


def test_valid_record_round_trips_through_json(make_record: Callable[..., NewRecord]) -> None:
    record = make_record().validate()
    assert NewRecord.from_json(record.to_json()) == record
    assert record.shape_key == "K=12288,M=8192,N=4096"


def test_from_json_names_unknown_and_missing_fields(make_record: Callable[..., NewRecord]) -> None:
    data = make_record().to_json()
    del data["dtype"]
    data["colour"] = "blue"
    with pytest.raises(InvalidRecordError, match="dtype: Field required; colour: 'blue' is not allowed"):
        NewRecord.from_json(data)
    with pytest.raises(InvalidRecordError, match="list is not allowed"):
        NewRecord.from_json([1, 2])  # type: ignore[arg-type]


def test_values_are_frozen(make_record: Callable[..., NewRecord]) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_record().kernel = "x"  # type: ignore[misc]


def test_schema_head_constant_matches_the_migrations() -> None:
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == head_revision()
