"""Priors (issue 34): what the store knows of a neighbouring shape, world size or GPU of the same architecture is a
warm start of a new study, visible on its trials, in its study and in its summary; never the answer itself."""

from __future__ import annotations

import optuna
from jt_tuning import result_of, tune

from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_PRIOR, ATTR_ROLE, STUDY_PRIORS, open_storage, trial_config
from jointtune.db import NewRecord, open_store
from jointtune.hardware import HardwareFingerprint, cpu_fingerprint, detect
from jointtune.search_spaces import Problem

FAST = TuneSettings(trials=6, warmup=0, iters=2, seed=1)


def _record(families, url: str, config: dict, *, m: int, world_size: int, hardware_id: str, p50: float) -> None:
    open_store(url).upsert_record(
        NewRecord(kernel="jt_sleep", kernel_version=families.SleepFamily().version,
                  space_version=families.SLEEP_SPACE.version, shape={"M": m}, dtype="float32", world_size=world_size,
                  hardware_id=hardware_id, triton_version="3.6", config=config, latency_p50_us=p50)
    )  # fmt: skip


def test_warm_starts_come_from_a_near_shape_another_gpu_of_the_arch_and_another_world_size(families, sqlite_url):
    here = detect().hardware_id
    store = open_store(sqlite_url)
    # another machine of this one's architecture (the interpreter's, "cpu"), and one of another (sm_90)
    twin = cpu_fingerprint(gpus_per_node=2)
    h100 = HardwareFingerprint(name="h100-sxm", compute_capability=(9, 0), num_sms=132, memory_gib=80,
                               gpus_per_node=2, interconnect="nvlink", nvlink_links=18)  # fmt: skip
    for fp in (twin, h100):
        store.upsert_hardware(hardware_id=fp.hardware_id, name=fp.name, fingerprint=fp.to_json())
    near = {"mode": "fast", "tile": 16, "chunk": 1}
    other_gpu = {"mode": "fast", "tile": 8, "chunk": 2}
    other_w = {"mode": "fast", "tile": 2, "chunk": 4}
    _record(families, sqlite_url, near, m=32, world_size=2, hardware_id=here, p50=50.0)
    _record(families, sqlite_url, other_gpu, m=64, world_size=2, hardware_id=twin.hardware_id, p50=40.0)
    _record(families, sqlite_url, other_w, m=64, world_size=4, hardware_id=here, p50=30.0)
    _record(families, sqlite_url, {"mode": "fast", "tile": 4, "chunk": 2}, m=64, world_size=2,
            hardware_id=h100.hardware_id, p50=1.0)  # fmt: skip
    job = Job.of("jt_sleep", Problem.of({"M": 64}, dtype="float32", world_size=2), FAST)
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    trials = sorted(result.state.counted, key=lambda t: t.number)
    warm = [(trial_config(t), t.user_attrs[ATTR_PRIOR]) for t in trials if t.user_attrs.get(ATTR_ROLE) == "warm"]
    assert [(config, source["kind"]) for config, source in warm] == [
        (near, "nearest-shape"),
        (other_gpu, "other-gpu"),
        (other_w, "other-world-size"),
    ]  # and nothing from the H100: another architecture
    sources = [source for _, source in warm]
    assert [s["shape"] for s in sources] == [{"M": 32}, {"M": 64}, {"M": 64}]
    assert [(s["world_size"], s["hardware_id"]) for s in sources[1:]] == [(2, twin.hardware_id), (4, here)]
    # the study lists them, and so do its results and its summary line
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(sqlite_url))
    assert [s["kind"] for s in study.user_attrs[STUDY_PRIORS]] == ["nearest-shape", "other-gpu", "other-world-size"]
    assert [s["kind"] for s in result.to_json()["warm_starts"]] == [s["kind"] for s in sources]
    assert "warm starts: 3 (nearest-shape 1, other-gpu 1, other-world-size 1)" in result.summary_line()
    # a prior is never the answer by itself: the study's best is what the study measured
    assert result.best_us == min(t.value for t in trials if t.value is not None)
    assert result.to_json()["start"] == {"baseline": 1, "default": 1, "warm": 3}
