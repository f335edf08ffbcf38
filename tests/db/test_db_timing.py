"""Timing policies in the store (both backends): one record per policy per key, lookups within a policy,
and revision 0004 keeping every earlier record as `gpu`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from jointtune.db import InvalidRecordError, NewRecord, RecordKey, Store

KEY = {"kernel": "ag_gemm", "kernel_version": "v1", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}
SHAPE = {"M": 8192, "N": 4096, "K": 12288}


def test_each_policy_keeps_its_own_record_for_a_key(store: Store, make_record: Callable[..., NewRecord]) -> None:
    gpu, _ = store.upsert_record(make_record(latency_p50_us=500.0, config={"mode": "push"}))
    eager, stored = store.upsert_record(make_record(latency_p50_us=700.0, config={"mode": "ce"}, timing="eager"))
    assert stored and eager.id != gpu.id and (gpu.timing, eager.timing) == ("gpu", "eager")
    # a slower eager record would not replace the faster gpu one, and a faster one replaces only its policy's
    faster, stored = store.upsert_record(make_record(latency_p50_us=650.0, config={"mode": "baseline"}, timing="eager"))
    assert stored and faster.id == eager.id
    assert store.best(RecordKey(**KEY, shape=SHAPE)).config == {"mode": "push"}  # default: gpu
    assert store.best(RecordKey(**KEY, shape=SHAPE, timing="eager")).config == {"mode": "baseline"}
    assert store.best(RecordKey(**KEY, shape=SHAPE, timing="graph")) is None
    assert store.count_records(RecordKey.any(timing="eager")) == 1 and store.count_records() == 2
    assert [r.timing for r in store.list_records(RecordKey.any(timing="gpu"))] == ["gpu"]


def test_nearest_searches_within_one_policy(store: Store, make_record: Callable[..., NewRecord]) -> None:
    store.upsert_record(make_record(shape={"M": 4096, "N": 4096, "K": 12288}, config={"mode": "ce"}, timing="eager"))
    store.upsert_record(make_record(shape={"M": 8192, "N": 4096, "K": 8192}, config={"mode": "push"}))
    near = store.nearest(RecordKey(**KEY, shape=SHAPE, timing="eager"))
    assert [r.config for r, _ in near] == [{"mode": "ce"}] and near[0][1] == pytest.approx(1.0)
    assert [r.config for r, _ in store.nearest(RecordKey(**KEY, shape=SHAPE))] == [{"mode": "push"}]
    assert store.nearest(RecordKey(**KEY, shape=SHAPE, timing="graph")) == []


def test_bad_policies_are_refused_naming_the_field(store: Store, make_record: Callable[..., NewRecord]) -> None:
    with pytest.raises(InvalidRecordError, match=r"timing: 'wall' is not allowed"):
        store.upsert_record(make_record(timing="wall"))
    with pytest.raises(InvalidRecordError, match=r"timing"):
        store.best(RecordKey(**KEY, shape=SHAPE, timing="eagerly"))
    assert store.count_records() == 0


def test_revision_0004_keeps_every_record_as_gpu(db_url: str, make_record: Callable[..., NewRecord]) -> None:
    """A store at revision 0003 with records: after the upgrade they are gpu records of the same keys,
    and an eager record of the same key can join them."""
    from alembic import command

    from jointtune.db._engine import make_engine
    from jointtune.db._migrate import alembic_config

    engine = make_engine(db_url)
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0003")
        conn.execute(sa.text("INSERT INTO jt_kernels (name, version, created_at) VALUES ('ag_gemm', 'v1', "
                             "CURRENT_TIMESTAMP)"))  # fmt: skip
        conn.execute(sa.text("INSERT INTO jt_hardware_profiles (hardware_id, name, fingerprint, created_at) "
                             "VALUES ('h200x2-nvl', 'h200x2-nvl', '{}', CURRENT_TIMESTAMP)"))  # fmt: skip
        conn.execute(
            sa.text(
                "INSERT INTO jt_records (kernel, kernel_version, space_version, shape, shape_key, dims_signature, "
                "dtype, world_size, hardware_id, triton_version, config, config_hash, latency_p50_us, trials, "
                "tuner_version, created_at, updated_at) VALUES ('ag_gemm', 'v1', 's1', "
                "'{\"K\": 12288, \"M\": 8192, \"N\": 4096}', 'K=12288,M=8192,N=4096', 'K,M,N', 'bfloat16', 2, "
                "'h200x2-nvl', '3.6', '{\"mode\": \"push\"}', 'h', 500.0, 3, '0.1.0', CURRENT_TIMESTAMP, "
                "CURRENT_TIMESTAMP)"
            )
        )
    engine.dispose()
    with Store(db_url) as store:
        (kept,) = store.list_records()
        assert kept.timing == "gpu" and kept.config == {"mode": "push"}
        assert store.best(RecordKey(**KEY, shape=SHAPE)).id == kept.id
        _, stored = store.upsert_record(make_record(latency_p50_us=900.0, timing="eager"))
        assert stored and store.count_records() == 2


def test_revision_0004_keeps_sqlite_ids_unique(tmp_path, make_record: Callable[..., NewRecord]) -> None:
    """The table rebuild of 0004 must not hand a deleted record's id out again (SQLite's AUTOINCREMENT
    counter would fall back to the largest id still present)."""
    from alembic import command

    from jointtune.db._engine import make_engine
    from jointtune.db._migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'ids.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0003")
    engine.dispose()
    with Store(url, migrate=False) as store:  # records made at 0003, the last one deleted
        ids = []
        for m in (1024, 2048, 4096):
            stmt = sa.text(
                "INSERT INTO jt_records (kernel, kernel_version, space_version, shape, shape_key, dims_signature, "
                "dtype, world_size, hardware_id, triton_version, config, config_hash, latency_p50_us, trials, "
                "tuner_version, "
                "created_at, updated_at) VALUES ('ag_gemm', 'v1', 's1', :shape, :key, 'K,M,N', 'bfloat16', 2, "
                "'h200x2-nvl', '3.6', '{}', 'h', 500.0, 3, '0.1.0', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
            with store.engine.begin() as conn:
                if m == 1024:
                    conn.execute(sa.text("INSERT INTO jt_kernels (name, version, created_at) VALUES ('ag_gemm', 'v1', "
                                         "CURRENT_TIMESTAMP)"))  # fmt: skip
                    profile = ("INSERT INTO jt_hardware_profiles (hardware_id, name, fingerprint, created_at) "
                               "VALUES ('h200x2-nvl', 'h', '{}', CURRENT_TIMESTAMP)")  # fmt: skip
                    conn.execute(sa.text(profile))
                shape = json.dumps({"K": 12288, "M": m, "N": 4096})
                ids.append(conn.execute(stmt, {"shape": shape, "key": f"K=12288,M={m},N=4096"}).lastrowid)
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM jt_records WHERE id = :id"), {"id": ids[-1]})
    with Store(url) as store:
        new, _ = store.upsert_record(make_record(timing="eager"))
        assert new.id > ids[-1], (new.id, ids)


def test_revision_0006_labels_the_interpreters_records_interp(
    db_url: str, make_record: Callable[..., NewRecord]
) -> None:
    """Records a CPU-only machine stored as gpu or eager become interp; a key with both keeps the faster; a GPU's
    records are untouched. Downgrading makes them gpu again."""
    from alembic import command

    from jointtune.db._engine import make_engine
    from jointtune.db._migrate import alembic_config

    cpu = "cpu-interpreter-x1-none-1a2b3c4d"
    engine = make_engine(db_url)
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0005")
    engine.dispose()
    with Store(db_url, migrate=False) as old:
        old.upsert_record(make_record(hardware_id=cpu, latency_p50_us=600.0, config={"mode": "push"}))
        old.upsert_record(make_record(hardware_id=cpu, latency_p50_us=500.0, config={"mode": "ce"}, timing="eager"))
        old.upsert_record(make_record(hardware_id=cpu, shape={"M": 64, "N": 64, "K": 64}, latency_p50_us=90.0))
        old.upsert_record(make_record(latency_p50_us=610.0))  # a GPU's
    with Store(db_url) as store:
        records = {(r.hardware_id, r.shape["M"]): r for r in store.list_records()}
        assert store.count_records() == 3
        assert (records[cpu, 8192].timing, records[cpu, 8192].config) == ("interp", {"mode": "ce"})
        assert records[cpu, 64].timing == "interp" and records["h200x2-nvl", 8192].timing == "gpu"
        on_cpu = RecordKey(**{**KEY, "hardware_id": cpu}, shape=SHAPE, timing="interp")
        assert store.best(on_cpu).latency_p50_us == 500.0
    engine = make_engine(db_url)
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, "0005")
        assert {row[0] for row in conn.execute(sa.text("SELECT timing FROM jt_records"))} == {"gpu"}
    engine.dispose()


def test_revision_0007_gives_records_their_studys_trial_count(
    db_url: str, make_record: Callable[..., NewRecord]
) -> None:
    """A record stored when its config was found (trial 1 of its study) gets the study's count on upgrade, by the
    tuner's own rule (invalid suggestions and cached repeats are no trials); a record whose study is not in this
    database, and one whose count is higher already, keep theirs."""
    import optuna
    from alembic import command
    from optuna.trial import TrialState, create_trial

    from jointtune.db._engine import make_engine
    from jointtune.db._migrate import alembic_config

    engine = make_engine(db_url)
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
    engine.dispose()
    with Store(db_url, migrate=False) as old:
        old.upsert_record(make_record(study_name="study-a", trials=1))
        old.upsert_record(make_record(shape={"M": 64, "N": 64, "K": 64}, study_name="elsewhere", trials=2))
        old.upsert_record(make_record(shape={"M": 128, "N": 64, "K": 64}, study_name="study-b", trials=50))
        kwargs = old.optuna_engine_kwargs()
    storage = optuna.storages.RDBStorage(db_url, engine_kwargs=kwargs)
    try:
        for name, trials in (("study-a", 6), ("study-b", 1)):
            study = optuna.create_study(study_name=name, storage=storage)
            for i in range(trials):
                attrs = [{}, {}, {}, {"fail_reason": "compile"}, {"fail_reason": "invalid"}, {"jt_cached": 0}][i]
                state = TrialState.PRUNED if "fail_reason" in attrs else TrialState.COMPLETE
                study.add_trial(create_trial(state=state, value=None if state == TrialState.PRUNED else 1.0 + i,
                                             user_attrs=attrs))  # fmt: skip
    finally:
        storage.remove_session()
        storage.engine.dispose()
    with Store(db_url) as store:
        counts = {r.study_name: r.trials for r in store.list_records()}
    assert counts == {"study-a": 4, "elsewhere": 2, "study-b": 50}  # 3 measured + 1 failed; the rest kept
