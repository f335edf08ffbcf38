"""The record key (`jointtune.db.RecordKey`): derived from RecordIn like Record, checked with RecordIn's rules, and
the one value the store, the client, the route, the run-time identity and the tuning key pass around."""

from __future__ import annotations

import dataclasses

import pytest

from jointtune.autotune.tuner.keys import TuningKey
from jointtune.db import KEY_FIELDS, PUBLISHED, InvalidRecordError, NewRecord, RecordIn, RecordKey
from jointtune.db.record import FIELD_TYPES
from jointtune.search_spaces import Problem

KEY = dict(kernel="ag_gemm", kernel_version="v1", shape={"N": 64, "M": 128}, dtype="bf16", world_size=2,
           hardware_id="h200x2-nvl")  # fmt: skip


def test_the_key_is_recordins_key_fields_with_their_types_and_defaults() -> None:
    assert tuple(name for name in PUBLISHED if name in KEY_FIELDS) == KEY_FIELDS
    assert KEY_FIELDS == ("kernel", "kernel_version", "shape", "dtype", "world_size", "hardware_id", "timing")
    fields = {f.name: f for f in dataclasses.fields(RecordKey)}
    assert list(fields) == list(KEY_FIELDS) and all(fields[n].type == FIELD_TYPES[n] for n in KEY_FIELDS)
    assert RecordKey(**KEY).timing == RecordIn.model_fields["timing"].default == "gpu"


def test_checked_resolves_aliases_sorts_dims_and_names_every_bad_field() -> None:
    key = RecordKey(**KEY).checked()
    assert (key.dtype, list(key.shape), key.shape_key) == ("bfloat16", ["M", "N"], "M=128,N=64")
    with pytest.raises(InvalidRecordError, match="exact lookups need a version"):
        RecordKey(**{**KEY, "kernel_version": None}).checked()
    assert RecordKey(**{**KEY, "kernel_version": None}).checked(versioned=False).kernel_version is None
    with pytest.raises(InvalidRecordError) as err:
        RecordKey(**{**KEY, "world_size": True, "dtype": "bfloat17"}).checked()
    assert "world_size" in str(err.value) and "dtype" in str(err.value)


def test_a_records_key_a_filter_and_a_record_built_for_a_key() -> None:
    record = NewRecord.for_key(RecordKey(**KEY), space_version="s1", triton_version="3.6", config={"mode": "baseline"},
                               latency_p50_us=10.0)  # fmt: skip
    assert RecordKey.of(record) == RecordKey(**KEY) and record.validate().shape_key == "M=128,N=64"
    assert RecordKey.of(record, timing="graph").timing == "graph"
    assert RecordKey.any(kernel="ag_gemm", dtype="bf16").where() == {"kernel": "ag_gemm", "dtype": "bfloat16"}


def test_the_tuning_key_is_a_record_key() -> None:
    problem = Problem.of({"M": 128, "N": 64}, dtype="bf16", world_size=2)
    key = TuningKey.of("ag_gemm", "v1", problem, "h200x2-nvl")
    assert isinstance(key, RecordKey) and RecordKey.of(key) == RecordKey(**KEY).checked()
    assert TuningKey.from_json(key.to_json()) == key
