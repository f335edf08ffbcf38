"""The final round (`tuner/finalists.py`): a study's closest configs timed again side by side before its pick is kept.

On `jt_drift` (test families): x and y are 2% apart and the machine slows by 4% once y has run, so timed once each x
looks faster; the final round, timing both after the slowdown, keeps y. The simulated clock decides, not the load.
"""

from __future__ import annotations

import pytest
from jt_tuning import result_of, tune

from jointtune.autotune.tuner.finalists import COUNT, MARGIN, FinalRound
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import STUDY_FINAL, StudyState, open_storage
from jointtune.db import RecordKey, open_store
from jointtune.hardware import detect
from jointtune.search_spaces import Problem
from jointtune.timings import measured_as

FAST = TuneSettings(warmup=0, iters=2, seed=0, trials=3)
PROBLEM = Problem.of({"M": 64}, dtype="float32", world_size=2)


def _stored(url: str, family) -> object:
    hardware_id = detect().hardware_id
    key = RecordKey(kernel="jt_drift", kernel_version=family.version, shape={"M": 64}, dtype="float32",
                    world_size=2, hardware_id=hardware_id, timing=measured_as("gpu", hardware_id))  # fmt: skip
    return open_store(url).best(key)


def test_the_final_round_keeps_what_is_faster_side_by_side_and_its_record_replaces_the_study_s(
    families, sqlite_url, tmp_path
):
    family = families.DriftFamily()
    # without it: each config timed once, x (run before the machine slowed) is kept, though y is faster
    off = Job.of("jt_drift", PROBLEM, FAST.replace(final_rounds=0))
    off_url = f"sqlite:///{tmp_path / 'off.db'}"
    tune(off_url, off)
    plain = result_of(off_url, off)
    assert plain.best_config == {"mode": "x"} and plain.state.final is None
    assert _stored(off_url, family).config == {"mode": "x"}

    job = Job.of("jt_drift", PROBLEM, FAST)
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    final = result.state.final
    assert final is not None and result.counted == 3  # the round is no trial
    # the finalists: x and y (within 3% of the fastest trial); the baseline (2 ms) is not one
    assert final.configs == ['{"mode":"x"}', '{"mode":"y"}'] and final.pick == '{"mode":"y"}'
    assert all(len(final.p50[k]) == 5 for k in final.configs)  # 5 rounds, each timing both
    slow = families.DRIFT_SLOWDOWN
    assert final.median('{"mode":"y"}') == pytest.approx(families.DRIFT_MS["y"] * slow * 1e3, rel=1e-6)
    assert final.median('{"mode":"x"}') == pytest.approx(families.DRIFT_MS["x"] * slow * 1e3, rel=1e-6)
    assert result.best_config == {"mode": "y"} and result.best_us == pytest.approx(1e3 * slow, rel=1e-6)
    assert "re-timed 2 finalists side by side in 5 rounds" in result.summary_line()
    assert result.to_json()["final_round"]["pick"] == '{"mode":"y"}'
    # the study had stored x at its trial's 1.02 ms; the round's pick replaced it though its p50 is higher
    record = _stored(sqlite_url, family)
    assert record.config == {"mode": "y"} and record.latency_p50_us == pytest.approx(1e3 * slow, rel=1e-6)
    assert record.trials == 3 and record.study_name == result.study_name

    # a second run of the finished study runs no new round and changes nothing
    tune(sqlite_url, job)
    assert result_of(sqlite_url, job).state.final == final


def test_a_round_holds_only_for_the_trials_it_judged():
    """A study resumed with a larger budget has more trials than its round judged: its best is its fastest trial
    again until a new round judges them all."""
    import optuna

    study = optuna.create_study()
    for config, value in [('{"mode":"x"}', 1.02), ('{"mode":"y"}', 1.04), ('{"mode":"z"}', 1.5)]:
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"jt_config": config}))
    trials = study.get_trials()
    chosen = StudyState.of(trials).finalists(margin=MARGIN, count=COUNT)
    assert chosen == ['{"mode":"x"}', '{"mode":"y"}']  # z is 47% off the fastest
    timings = {'{"mode":"x"}': [1.1, 1.09, 1.1], '{"mode":"y"}': [1.05, 1.06, 1.04]}
    calls = []

    def measure(config):
        key = f'{{"mode":"{config["mode"]}"}}'
        calls.append(key)
        value = timings[key][sum(1 for c in calls if c == key) - 1]
        return value, value, value

    final = FinalRound.run(chosen, measure, counted=3, rounds=3)
    # rotated rounds: x y, y x, x y
    assert calls == ['{"mode":"x"}', '{"mode":"y"}', '{"mode":"y"}', '{"mode":"x"}', '{"mode":"x"}', '{"mode":"y"}']
    assert final.pick == '{"mode":"y"}' and final.median(final.pick) == 1.05
    judged = StudyState.of(trials, attrs={STUDY_FINAL: final.to_json()})
    assert judged.best.user_attrs["jt_config"] == '{"mode":"y"}' and judged.best_value == 1.05
    assert judged.best_percentiles() == (1.05, 1.05, 1.05)
    study.add_trial(optuna.trial.create_trial(value=1.3, user_attrs={"jt_config": '{"mode":"w"}'}))
    resumed = StudyState.of(study.get_trials(), attrs={STUDY_FINAL: final.to_json()})
    assert resumed.final is None and resumed.best.user_attrs["jt_config"] == '{"mode":"x"}'
    # an attr that is not a round (hand-written, or another form) is ignored
    assert StudyState.of(trials, attrs={STUDY_FINAL: {"pick": "?"}}).final is None


def test_a_finalist_that_fails_in_the_round_leaves_it():
    import optuna

    study = optuna.create_study()
    for config, value in [('{"mode":"x"}', 1.0), ('{"mode":"y"}', 1.01)]:
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"jt_config": config}))
    chosen = StudyState.of(study.get_trials()).finalists(margin=MARGIN, count=COUNT)
    final = FinalRound.run(chosen, lambda c: None if c["mode"] == "x" else (2.0, 2.0, 2.0), counted=2, rounds=2)
    assert final.failed == ['{"mode":"x"}'] and final.pick == '{"mode":"y"}'
    assert final.p50 == {'{"mode":"y"}': [2.0, 2.0]}


def test_storage_notes_the_round_on_the_study(families, sqlite_url):
    job = Job.of("jt_drift", PROBLEM, FAST)
    tune(sqlite_url, job)
    studies = open_storage(sqlite_url).get_all_studies()
    (summary,) = [s for s in studies if s.study_name.startswith("jointtune:jt_drift")]
    assert summary.user_attrs[STUDY_FINAL]["pick"] == '{"mode":"y"}'
