"""The tuning loop in one process (a local world, no spawning): budgets, warm start, records, precompile."""

from __future__ import annotations

import optuna
import pytest
from jt_tuning import result_of, tune
from optuna.trial import TrialState

from jointtune.autotune.tuner.results import collect
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_REASON, ATTR_ROLE, open_storage, trial_config, trial_kind
from jointtune.db import NewRecord, open_store
from jointtune.hardware import detect
from jointtune.search_spaces import Problem, canonical_json

FAST = TuneSettings(trials=8, warmup=0, iters=2, seed=1, lookahead=1)
BEST = {"mode": "fast", "tile": 4, "chunk": 2}


def sleep_job(m: int = 64, **changes) -> Job:
    return Job.of("jt_sleep", Problem.of({"M": m}, dtype="float32", world_size=2), FAST.replace(**changes))


def test_tpe_spends_exactly_the_budget_and_publishes_the_best(families, sqlite_url):
    job = sleep_job(trials=8)
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    assert result.counted == 8 and result.done_reason == "trials"
    ok = [t for t in result.trials if trial_kind(t) == "ok"]
    assert {t.user_attrs["p10_us"] <= t.value <= t.user_attrs["p90_us"] for t in ok} == {True}
    # the baseline is always measured first, so records carry a speedup
    first = min(result.trials, key=lambda t: t.number)
    assert trial_config(first) == {"mode": "baseline"} and first.user_attrs[ATTR_ROLE] == "baseline"
    assert result.baseline_us == pytest.approx(first.value)
    record = families.stored_best(sqlite_url, families.SleepFamily())
    assert record is not None
    assert record.config == result.best_config
    assert record.latency_p50_us == pytest.approx(result.best_us)
    assert record.baseline_us == pytest.approx(result.baseline_us)
    assert record.speedup == pytest.approx(result.baseline_us / result.best_us)


def test_exhaustive_runs_every_valid_config_once_and_finds_the_best(families, sqlite_url):
    job = sleep_job(strategy="exhaustive")
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    configs = [trial_config(t) for t in result.state.counted]
    assert len(configs) == 13 == len({str(sorted(c.items())) for c in configs})
    assert result.done_reason == "exhausted"
    assert result.best_config == BEST
    assert result.speedup > 5


def test_warm_start_enqueues_baseline_default_and_nearest_shapes_best(families, sqlite_url):
    warm = {"mode": "fast", "tile": 8, "chunk": 1}
    open_store(sqlite_url).upsert_record(
        NewRecord(
            kernel="jt_sleep",
            kernel_version=families.SleepFamily().version,
            space_version=families.SLEEP_SPACE.version,
            shape={"M": 32},
            dtype="float32",
            world_size=2,
            hardware_id=detect().hardware_id,
            triton_version="3.6",
            config=warm,
            latency_p50_us=100.0,
        )
    )
    job = sleep_job(m=128, trials=3)
    tune(sqlite_url, job)
    trials = sorted(result_of(sqlite_url, job).state.counted, key=lambda t: t.number)
    roles = [(t.user_attrs.get(ATTR_ROLE), trial_config(t)) for t in trials]
    assert roles == [
        ("baseline", {"mode": "baseline"}),
        ("default", {"mode": "fast", "tile": 1, "chunk": 1}),
        ("warm", warm),
    ]
    # where the warm start came from is on its trial (a gpu-timed record: the interp study had none of its own)
    source = trials[2].user_attrs["jt_prior"]
    assert source["kind"] == "nearest-shape" and source["shape"] == {"M": 32} and source["timing"] == "gpu"


def test_precompile_hook_sees_each_config_before_it_runs(families, sqlite_url):
    families.PRECOMPILED.clear()
    job = sleep_job(trials=6, lookahead=2)
    tune(sqlite_url, job)
    counted = sorted(result_of(sqlite_url, job).state.counted, key=lambda t: t.number)
    ran = [canonical_json(trial_config(t)) for t in counted]
    compiled = [canonical_json(c) for c in families.PRECOMPILED]
    assert sorted(compiled) == sorted(ran)  # each config once, none extra
    # trials were claimed ahead: the third config was compiling before the first finished
    assert compiled[:3] == ran[:3]


def test_time_budget_and_patience_stop_a_study_early(families, sqlite_url):
    slow = sleep_job(m=640, trials=50, time_budget_s=0.15)
    tune(sqlite_url, slow)
    result = result_of(sqlite_url, slow)
    assert result.done_reason == "time" and 1 <= result.counted < 10
    assert result.stop_text.startswith("used its time budget: ")
    assert result.stop_text.endswith(" of trial time of 0.15 s")
    patient = sleep_job(m=32, trials=50, patience=2, strategy="exhaustive")
    tune(sqlite_url, patient)
    assert result_of(sqlite_url, patient).done_reason == "exhausted"  # exhaustive ignores patience
    patient = sleep_job(m=32, trials=50, patience=3, seed=4)
    tune(sqlite_url, patient)
    result = result_of(sqlite_url, patient)
    assert result.done_reason == "patience"
    assert result.state.since_best == 3
    # it says why, with the numbers: how many trials since which best, and the setting
    best = result.state.best
    since = f"since the best (trial {best.number}, {best.value:,.1f} µs)"
    assert result.stop_text == f"patience: 3 trials {since} without a faster one (patience 3)"
    assert result.to_json()["stop"] == result.stop_text and result.summary_line().count(result.stop_text) == 1


def test_many_groups_of_jobs_share_one_database_and_two_runs_agree(families, sqlite_url, tmp_path):
    jobs = [sleep_job(m=m, trials=6, seed=7) for m in (32, 64)]
    tune(sqlite_url, *jobs)
    again = f"sqlite:///{tmp_path / 'again.db'}"
    tune(again, *jobs)
    for job in jobs:
        first, second = result_of(sqlite_url, job), result_of(again, job)
        assert [trial_config(t) for t in first.state.counted] == [trial_config(t) for t in second.state.counted]
    # a finished sweep run again does nothing: the studies are done
    storage = open_storage(sqlite_url)
    names = [r.study_name for r in collect(storage, jobs, hardware_id=detect().hardware_id)]
    count = lambda: sum(len(optuna.load_study(study_name=n, storage=storage).trials) for n in names)
    before = count()
    tune(sqlite_url, *jobs)
    after = count()
    assert before == after


def test_a_family_whose_every_config_fails_is_failed_entirely(families, sqlite_url):
    job = Job.of("jt_broken", Problem.of({"M": 64}, dtype="float32", world_size=2), FAST.replace(trials=3))
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    assert result.failed_entirely and result.counted == 3
    reasons = {t.user_attrs[ATTR_REASON] for t in result.state.counted}
    assert reasons == {"error"}
    assert all(t.state == TrialState.PRUNED for t in result.state.counted)
