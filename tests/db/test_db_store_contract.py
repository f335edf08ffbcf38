"""One contract for the store, run on SQLite and PostgreSQL (the `db_url` fixture)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from jointtune.db import InvalidRecordError, NewRecord, RecordKey, Store, head_revision
from jointtune.db._models import VERSION_TABLE, Base

MakeRecord = Callable[..., NewRecord]
TABLES = {"jt_hardware_profiles", "jt_kernels", "jt_records", VERSION_TABLE}
KEY = {"kernel": "ag_gemm", "kernel_version": "v1", "dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}


_NOW = datetime(2026, 11, 21, tzinfo=timezone.utc)


class TestStoreContract:
    def test_upgrades_a_revision_0001_database_keeping_its_records(self, db_url: str) -> None:
        """0002 drops the per-dim rows of 0001; records survive and nearest reads their shape JSON."""
        from alembic import command

        from jointtune.db._engine import make_engine
        from jointtune.db._migrate import alembic_config

        engine = make_engine(db_url)
        with engine.begin() as conn:
            config = alembic_config()
            config.attributes["connection"] = conn
            command.upgrade(config, "0001")
            conn.execute(
                sa.text("INSERT INTO jt_kernels (name, version, created_at) VALUES ('ag_gemm', 'v1', :t)"), {"t": _NOW}
            )
            conn.execute(
                sa.text("INSERT INTO jt_hardware_profiles (hardware_id, name, fingerprint, created_at) "
                        "VALUES ('h200x2-nvl', 'h200x2-nvl', '{}', :t)"), {"t": _NOW})  # fmt: skip
            shape = {"M": 8192, "N": 4096, "K": 12288}
            row = dict(kernel="ag_gemm", kernel_version="v1", space_version="s", shape=shape,
                       shape_key="K=12288,M=8192,N=4096", dims_signature="K,M,N", dtype="bfloat16", world_size=2,
                       hardware_id="h200x2-nvl", triton_version="3.6", config={"mode": "ce"}, config_hash="x",
                       latency_p50_us=500.0, trials=4, tuner_version="0", created_at=_NOW, updated_at=_NOW)  # fmt: skip
            records = Base.metadata.tables["jt_records"]
            rid = conn.execute(sa.insert(records).values(**row).returning(records.c.id)).scalar_one()
            conn.execute(
                sa.text("INSERT INTO jt_record_dims (record_id, name, value, log2) VALUES (:r, 'M', 8192, 13)"),
                {"r": rid},
            )
        engine.dispose()
        with Store(db_url) as old:  # upgrades 0001 -> head
            assert old.migration is not None and old.migration.before == "0001"
            assert old.revision() == head_revision()
            with old.engine.connect() as conn:
                assert "jt_record_dims" not in sa.inspect(conn).get_table_names()
            kept = old.best(RecordKey(**KEY, shape=shape))
            assert kept is not None and kept.id == rid and kept.config == {"mode": "ce"}
            ((near, distance),) = old.nearest(RecordKey(**KEY, shape={**shape, "M": 4096}), limit=1)
            assert near.id == rid and distance == pytest.approx(1.0)

    def test_migrates_an_empty_database_once(self, db_url: str) -> None:
        with Store(db_url) as first:
            assert first.migration is not None and first.migration.before is None
            assert first.migration.after == head_revision() == first.revision()
            with first.engine.connect() as conn:
                assert set(sa.inspect(conn).get_table_names()) >= TABLES
                # the migrations create exactly what the models describe
                ours = lambda o, n, t, r, c: t != "table" or n.startswith("jt_")
                context = MigrationContext.configure(
                    conn, opts={"version_table": VERSION_TABLE, "include_object": ours}
                )
                assert compare_metadata(context, Base.metadata) == []
        with Store(db_url) as again:
            assert again.migration is not None and not again.migration.changed

    def test_upsert_keeps_the_faster_record(self, store: Store, make_record: MakeRecord) -> None:
        first, stored = store.upsert_record(make_record(latency_p50_us=600.0, config={"BLOCK_M": 64}))
        assert stored and first.latency_p50_us == 600.0 and first.speedup == pytest.approx(940 / 600)
        kept, stored = store.upsert_record(make_record(latency_p50_us=700.0, config={"BLOCK_M": 256}))
        assert not stored and kept == first
        tie, stored = store.upsert_record(make_record(latency_p50_us=600.0, config={"BLOCK_M": 32}))
        assert not stored and tie.config == {"BLOCK_M": 64}
        better, stored = store.upsert_record(make_record(latency_p50_us=500.0, config={"BLOCK_M": 128}, trials=9))
        assert stored and better.id == first.id
        assert (better.latency_p50_us, better.config, better.trials) == (500.0, {"BLOCK_M": 128}, 9)
        assert better.created_at == first.created_at and better.updated_at >= first.updated_at
        assert store.count_records() == 1

    def test_a_final_round_supersedes_only_its_own_study_s_record(self, store: Store, make_record: MakeRecord) -> None:
        """A study's final round (`tuner.finalists`) re-judges its pick side by side: its record replaces the one the
        same study stored whatever the p50s, and never another study's faster one."""
        first, _ = store.upsert_record(make_record(latency_p50_us=600.0, config={"BLOCK_M": 64}, study_name="a"))
        judged, stored = store.upsert_record(
            make_record(latency_p50_us=610.0, config={"BLOCK_M": 128}, study_name="a"), supersede=True
        )
        assert stored and judged.id == first.id and (judged.latency_p50_us, judged.config) == (610.0, {"BLOCK_M": 128})
        kept, stored = store.upsert_record(
            make_record(latency_p50_us=620.0, config={"BLOCK_M": 32}, study_name="b"), supersede=True
        )
        assert not stored and kept == judged
        assert store.count_records() == 1

    def test_upsert_is_idempotent(self, store: Store, make_record: MakeRecord) -> None:
        record = make_record()
        first, stored = store.upsert_record(record)
        again, stored_again = store.upsert_record(record)
        assert stored and not stored_again and again == first and again.trials == 64
        # a stored record round-trips through JSON and is still the same publish
        replay, stored = store.upsert_record(NewRecord.from_json(first.to_json()))
        assert not stored and replay == first
        assert store.count_records() == 1

    def test_note_trials_raises_only_its_studys_record(self, store: Store, make_record: MakeRecord) -> None:
        """The tuner raises its record's trial count as its study goes on; never lowers it, never touches a
        record another study made, and leaves `updated_at` (when a faster record replaced it) alone."""
        record, _ = store.upsert_record(make_record(study_name="study-a", trials=3))
        key = RecordKey.of(record)
        assert store.note_trials(key, study_name="study-a", trials=8)
        assert not store.note_trials(key, study_name="study-a", trials=5)  # a late report of an earlier count
        assert not store.note_trials(key, study_name="study-b", trials=20)  # not its record
        assert not store.note_trials(key.replace(dtype="float16"), study_name="study-a", trials=20)  # no record
        now = store.get_record(record.id)
        assert now.trials == 8 and now.updated_at == record.updated_at and now.latency_p50_us == record.latency_p50_us

    def test_best_matches_the_exact_key_only(self, store: Store, make_record: MakeRecord) -> None:
        record, _ = store.upsert_record(make_record())
        shape = {"K": 12288, "N": 4096, "M": 8192}  # dim order does not matter
        assert store.best(RecordKey(**KEY, shape=shape)) == record
        for field, other in [
            ("kernel_version", "v2"),
            ("dtype", "float16"),
            ("world_size", 4),
            ("hardware_id", "other"),
            ("kernel", "gemm_rs"),
        ]:
            assert store.best(RecordKey(**{**KEY, field: other}, shape=shape)) is None
        assert store.best(RecordKey(**KEY, shape={**shape, "M": 4096})) is None

    def test_nearest_orders_by_log2_distance(self, store: Store, make_record: MakeRecord) -> None:
        ids = {}
        for m, p50 in [(1024, 100.0), (2048, 300.0), (8192, 200.0), (16384, 50.0)]:
            ids[m] = store.upsert_record(make_record(shape={"M": m, "N": 4096, "K": 12288}, latency_p50_us=p50))[0].id
        store.upsert_record(make_record(shape={"M": 4096, "N": 4096}, latency_p50_us=1.0))  # other dims
        store.upsert_record(make_record(shape={"M": 4096, "N": 4096, "K": 12288}, hardware_id="elsewhere"))
        found = store.nearest(RecordKey(**KEY, shape={"M": 4096, "N": 4096, "K": 12288}), limit=10)
        # 8192 and 2048 are both one doubling away: the faster (lower p50) comes first
        assert [(r.id, d) for r, d in found] == [
            (ids[8192], 1.0),
            (ids[2048], 1.0),
            (ids[16384], 2.0),
            (ids[1024], 2.0),
        ]
        exact = store.nearest(RecordKey(**KEY, shape={"M": 2048, "N": 4096, "K": 12288}))
        assert [(r.id, d) for r, d in exact] == [(ids[2048], 0.0)]
        diagonal = store.nearest(RecordKey(**KEY, shape={"M": 4096, "N": 8192, "K": 6144}), limit=1)
        assert diagonal[0][1] == pytest.approx(math.sqrt(1 + 1 + 1))
        assert store.nearest(RecordKey(**{**KEY, "dtype": "float16"}, shape={"M": 8192, "N": 4096, "K": 12288})) == []
        assert store.nearest(RecordKey(**KEY, shape={"M": 8192, "N": 4096, "K": 12288, "B": 2})) == []

    def test_nearest_across_kernel_versions_only_when_asked(self, store: Store, make_record: MakeRecord) -> None:
        old, _ = store.upsert_record(make_record(kernel_version="v0", shape={"M": 8192, "N": 4096, "K": 12288}))
        assert store.nearest(RecordKey(**KEY, shape={"M": 8192, "N": 4096, "K": 12288})) == []
        anyver = store.nearest(RecordKey(**{**KEY, "kernel_version": None}, shape={"M": 4096, "N": 4096, "K": 12288}))
        assert [(r.id, d) for r, d in anyver] == [(old.id, 1.0)]

    def test_list_filters_and_pages(self, store: Store, make_record: MakeRecord) -> None:
        for m in (128, 256, 512, 1024):
            for dtype in ("bfloat16", "float16"):
                store.upsert_record(make_record(shape={"M": m, "N": 64, "K": 64}, dtype=dtype))
        store.upsert_record(make_record(kernel="gemm_rs", world_size=4))
        assert store.count_records() == 9
        assert store.count_records(RecordKey.any(kernel="ag_gemm", dtype="float16")) == 4
        assert {r.world_size for r in store.list_records(RecordKey.any(world_size=4))} == {4}
        nowhere = RecordKey.any(hardware_id="nowhere")
        assert store.list_records(nowhere) == [] and store.count_records(nowhere) == 0
        pages = [store.list_records(RecordKey.any(kernel="ag_gemm"), limit=3, offset=o) for o in (0, 3, 6)]
        assert [len(p) for p in pages] == [3, 3, 2]
        assert len({r.id for page in pages for r in page}) == 8
        assert pages[0] == store.list_records(RecordKey.any(kernel="ag_gemm"), limit=3)  # stable order
        with pytest.raises(InvalidRecordError, match="limit: 0 is not allowed"):
            store.list_records(limit=0)
        with pytest.raises(InvalidRecordError, match="offset: -1 is not allowed"):
            store.list_records(offset=-1)

    def test_delete_removes_only_that_record(self, store: Store, make_record: MakeRecord) -> None:
        record, _ = store.upsert_record(make_record())
        kept, _ = store.upsert_record(make_record(dtype="float16"))
        assert store.delete_record(record.id) is True
        assert store.delete_record(record.id) is False
        assert store.get_record(record.id) is None and store.get_record(kept.id) == kept
        assert store.best(RecordKey(**KEY, shape=record.shape)) is None

    def test_hardware_profiles_and_kernels(self, store: Store, make_record: MakeRecord) -> None:
        store.upsert_record(make_record(hardware_id="auto-hw"))
        placeholder = store.get_hardware("auto-hw")
        assert placeholder is not None and placeholder.fingerprint == {}
        profile = store.upsert_hardware(hardware_id="auto-hw", name="2x H200 NVLink", fingerprint={"sms": 132})
        assert (profile.name, profile.fingerprint, profile.created_at) == (
            "2x H200 NVLink",
            {"sms": 132},
            placeholder.created_at,
        )
        store.upsert_hardware(hardware_id="a100", name="A100", fingerprint={"sms": 108})
        assert [h.hardware_id for h in store.list_hardware()] == ["a100", "auto-hw"]
        assert store.get_hardware("missing") is None
        again = store.upsert_kernel(name="ag_gemm", version="v1")
        assert again == store.upsert_kernel(name="ag_gemm", version="v1")
        store.upsert_kernel(name="flash_decode", version="f1")
        assert [(k.name, k.version) for k in store.list_kernels()] == [("ag_gemm", "v1"), ("flash_decode", "f1")]
        assert [k.version for k in store.list_kernels(name="flash_decode")] == ["f1"]
        with pytest.raises(InvalidRecordError, match=r"fingerprint: \['not', 'a', 'dict'\] is not allowed"):
            store.upsert_hardware(hardware_id="x", name="x", fingerprint=["not", "a", "dict"])  # type: ignore[arg-type]
        with pytest.raises(InvalidRecordError, match="kernel_version: '' is not allowed"):
            store.upsert_kernel(name="ag_gemm", version="")

    @pytest.mark.parametrize(
        ("override", "message"),
        [
            ({"latency_p50_us": -1.0}, "latency_p50_us: -1.0 is not allowed"),
            ({"latency_p50_us": float("nan")}, "latency_p50_us: nan is not allowed"),
            ({"baseline_us": float("inf")}, "baseline_us: inf is not allowed"),
            ({"kernel": ""}, "kernel: '' is not allowed"),
            ({"shape": {"M": 8.5}}, r"shape.M: 8.5 is not allowed"),
            ({"shape": {"M": True}}, r"shape.M: True is not allowed"),
            ({"shape": {"M=1": 2}}, "shape.M=1.*: 'M=1' is not allowed; use an identifier"),
            ({"shape": {}}, r"shape: \{\} is not allowed"),
            ({"world_size": 0}, "world_size: 0 is not allowed"),
            ({"triton_version": "3.6.0"}, "triton_version: '3.6.0' is not allowed; use major.minor"),
            ({"config": {"x": float("nan")}}, "config.x: nan is not allowed; Input should be a finite number"),
            ({"trials": -3}, "trials: -3 is not allowed"),
            ({"latency_p10_us": 700.0}, "must satisfy p10 <= p50 <= p90"),
        ],
    )
    def test_bad_records_are_rejected(
        self, store: Store, make_record: MakeRecord, override: dict, message: str
    ) -> None:
        with pytest.raises(InvalidRecordError, match=message):
            store.upsert_record(make_record(**override))
        assert store.count_records() == 0

    def test_bad_queries_are_rejected(self, store: Store) -> None:
        with pytest.raises(InvalidRecordError, match=r"shape.M: '8' is not allowed"):
            store.best(RecordKey(**KEY, shape={"M": "8"}))
        with pytest.raises(InvalidRecordError, match="kernel_version: None is not allowed"):
            store.best(RecordKey(**{**KEY, "kernel_version": None}, shape={"M": 8}))
        with pytest.raises(InvalidRecordError, match="limit: 0 is not allowed"):
            store.nearest(RecordKey(**KEY, shape={"M": 8}), limit=0)

    def test_optuna_storage_shares_the_database(self, store: Store, make_record: MakeRecord) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(store.url, engine_kwargs=store.optuna_engine_kwargs())
        study = optuna.create_study(study_name="ag_gemm-8192", storage=storage)
        study.optimize(lambda t: t.suggest_int("BLOCK_M", 16, 256), n_trials=2)
        storage.engine.dispose()
        record, _ = store.upsert_record(make_record(study_name=study.study_name))
        with Store(store.url) as reopened:  # Optuna's alembic_version does not confuse ours
            assert reopened.migration is not None and not reopened.migration.changed
            assert reopened.best(RecordKey(**KEY, shape=record.shape)) == record
        loaded = optuna.load_study(study_name=record.study_name, storage=store.url)
        assert len(loaded.trials) == 2
