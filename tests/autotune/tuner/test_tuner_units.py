"""The tuner's small parts: keys, settings, timing, watchdog, locks, classification, searcher, registry."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import optuna
import pytest
from optuna.trial import TrialState

from jointtune.autotune.tuner.keys import TuningKey, triton_version
from jointtune.autotune.tuner.locks import study_lock
from jointtune.autotune.tuner.search import Prior, Proposal, Searcher, initial_configs
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_CACHED, ATTR_DETAIL, ATTR_REASON, StudyState, open_storage, trial_kind
from jointtune.autotune.tuner.timing import measure, percentile, percentiles
from jointtune.autotune.workers.control import SoloControl
from jointtune.autotune.workers.executor import classify
from jointtune.autotune.workers.sweeps.registry import load_sweep, register_sweep, sweep_names
from jointtune.autotune.workers.watchdog import EXIT_TIMEOUT
from jointtune.errors import KernelError, TuningError
from jointtune.kernels.runtime.world import create_world
from jointtune.search_spaces import Constraint, DeviceLimits, Problem, Space, categorical, choice, register_space

PROBLEM = Problem.of({"M": 64}, dtype="float32", world_size=2)
LIMITS = DeviceLimits.nominal_hopper()


def test_keys_name_studies_stably_and_round_trip():
    key = TuningKey.of("ag_gemm", "abc123", Problem.of({"N": 8, "M": 4}, dtype="bf16", world_size=2), "hw-1")
    assert key.study_name(space_version="s1") == "jointtune:ag_gemm@abc123:M=4,N=8:bfloat16:w2:hw-1:ss1"
    assert key.study_name(space_version="s1", exhaustive=True).endswith(":exhaustive")
    assert TuningKey.from_json(key.to_json()) == key
    assert triton_version().count(".") == 1


def test_settings_reject_bad_values_by_name():
    with pytest.raises(TuningError, match="trials: 0 is not allowed"):
        TuneSettings(trials=0)
    with pytest.raises(TuningError, match="strategy: 'grid' is not allowed; allowed: tpe, random, exhaustive"):
        TuneSettings(strategy="grid")
    with pytest.raises(TuningError, match="time_budget_s: -1 is not allowed"):
        TuneSettings(time_budget_s=-1)
    with pytest.raises(TuningError, match=r"seed: 4294967296 is not allowed; it must be an integer in 0\.\.4294967295"):
        TuneSettings(seed=2**32)
    assert TuneSettings(seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(TuningError, match=r"final_rounds: -1 is not allowed; it must be an integer in 0\.\."):
        TuneSettings(final_rounds=-1)
    assert TuneSettings(final_rounds=0).final_rounds == 0 and TuneSettings().final_rounds == 5
    # a watchdog "turned off" with a huge or infinite value would crash every trial arming its timer
    for name in ("watchdog_factor", "first_trial_timeout_s", "watchdog_compile_s", "time_budget_s"):
        for value in (float("inf"), float("nan"), 1e300):
            with pytest.raises(TuningError, match=rf"{name}: .* is not allowed; it must be a number in \(0, 1000000\]"):
                TuneSettings(**{name: value})
    with pytest.raises(TuningError, match=r"trials: 2147483648 is not allowed; it must be an integer in 1\.\.2147"):
        TuneSettings(trials=2**31)
    with pytest.raises(TuningError, match="settings: 'trails' is not a setting"):
        TuneSettings.from_json({"trails": 3})
    job = Job.of("jt_sleep", PROBLEM, TuneSettings(trials=5, patience=2))
    assert Job.from_json(job.to_json()) == job and job.settings.startup_trials == 10  # whatever the budget


def test_percentiles_and_local_timing():
    assert percentiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.4, 3.0, 4.6)
    assert percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    calls = []
    samples = measure(lambda: (calls.append(1), time.sleep(0.002)), create_world("local", 2), warmup=2, iters=3)
    assert len(calls) == 5 and len(samples) == 3 and min(samples) >= 2000


def test_failures_are_classified_by_what_went_wrong():
    assert classify(KernelError("out of resources: shared memory")) == "compile"
    assert classify(ValueError("x"), compiling=True) == "compile"
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered")) == "crash"
    assert classify(RuntimeError("shape mismatch")) == "error"
    control = SoloControl()
    assert control.broadcast({"a": 1}) == {"a": 1} and control.all_gather(3) == [3]


def test_the_watchdog_records_then_ends_a_hung_process(tmp_path):
    marker = tmp_path / "expired"
    code = (
        "import time, pathlib; from jointtune.autotune.workers.watchdog import Watchdog\n"
        f"dog = Watchdog(); dog.arm(0.3, on_expire=lambda: pathlib.Path({str(marker)!r}).write_text('timeout'))\n"
        "time.sleep(30)\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_TIMEOUT and marker.read_text() == "timeout"
    assert time.monotonic() - start < 20 and "deadline passed" in done.stderr
    holds_gil = (
        "from jointtune.autotune.workers.watchdog import Watchdog\n"
        "dog = Watchdog(backstop_s=0.5); dog.arm(0.2, on_expire=lambda: None)\n"
        "import re; re.match(r'(a+)+$', 'a' * 40 + 'b')\n"  # catastrophic backtracking holds the GIL
    )
    done = subprocess.run([sys.executable, "-c", holds_gil], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Timeout" in done.stderr  # faulthandler's backstop ended it


def test_study_locks_exclude_each_other(sqlite_url):
    inside, overlaps = [], []

    def hold() -> None:
        with study_lock(sqlite_url, "s"):
            overlaps.append(len(inside))
            inside.append(1)
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [0, 0, 0, 0]


@pytest.mark.postgres
def test_postgres_advisory_locks_exclude_other_processes(pg_url):
    code = (
        "import sys, time; from jointtune.autotune.tuner.locks import study_lock\n"
        "with study_lock(sys.argv[1], 'study-x'):\n    print('in', flush=True); time.sleep(1.0)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "in"
    start = time.monotonic()
    with study_lock(pg_url, "study-x"):
        waited = time.monotonic() - start
    holder.wait()
    assert waited > 0.5
    with study_lock(pg_url, "study-y"):  # another study's lock is independent
        pass


def _picky_space() -> Space:
    def only_seven(cfg, ctx):
        return None if cfg["x"] == 7 or cfg["mode"] == "baseline" else f"x: {cfg['x']} is not allowed; allowed: 7"

    return register_space(
        Space(
            "jt_picky",
            dims=("M",),
            params=[categorical("mode", ("baseline", "fast")), choice("x", tuple(range(1, 13)))],
            constraints=[Constraint("seven", ("x", "mode"), "x == 7", only_seven)],
            revision=1,
            default=lambda ctx: {"mode": "fast", "x": 7},
        ),
        replace=True,
    )


def test_proposals_stay_inside_the_valid_space_and_a_refused_config_costs_no_trial():
    space = _picky_space()  # under mode=fast only x=7 of 12 is valid
    for strategy in ("random", "tpe"):
        study = optuna.create_study()
        searcher = Searcher(space, PROBLEM, LIMITS, TuneSettings(trials=10, seed=2, strategy=strategy))
        for _ in range(8):
            proposal = searcher.propose(study)
            assert isinstance(proposal, Proposal) and not space.violations(proposal.config, PROBLEM, LIMITS)
            study.tell(proposal.trial, 1.0)
        state = StudyState.of(study.trials)
        assert state.refused_count == 0 and state.proposals_text().startswith("refused 0 proposals")
        assert state.moved_trials and state.moved == {"x": state.moved_trials}  # draws of mode=fast, x!=7, redrawn
    # fixed values that leave nothing valid (a two-stage search's): refused, never run, never counted, bounded
    study = optuna.create_study()
    settings = TuneSettings(trials=10, max_invalid_streak=5, seed=2, strategy="random")
    searcher = Searcher(space, PROBLEM, LIMITS, settings, fixed={"mode": "fast", "x": 3})
    assert searcher.propose(study) == "invalid-streak"
    invalid = [t for t in study.trials if trial_kind(t) == "invalid"]
    assert len(invalid) == 5 and all(t.state == TrialState.PRUNED for t in invalid)
    assert all("x:" in t.user_attrs[ATTR_DETAIL] and t.user_attrs[ATTR_REASON] == "invalid" for t in invalid)
    state = StudyState.of(study.trials, attrs=study.user_attrs)
    assert state.trial_count == 0 and state.refused_count == 5 and state.refused == {"x": 5}
    assert state.proposals_text() == "refused 5 proposals (x 5) (no trial spent)"
    assert study.user_attrs["jt_stop_detail"] == "the space refused 5 proposals in a row"


def test_a_sparse_space_is_searched_to_its_end_not_cut_by_the_invalid_streak():
    """One config in 400 valid (as flash_decode's heads_per_program for multi-head attention, 1 of 16): the
    sampler alone proposes 100 invalid configs in a row most of the time; the walk hands it the valid one."""

    def only_seven(cfg, ctx):
        return None if cfg["x"] == 7 else f"x: {cfg['x']} is not allowed; allowed: 7"

    space = register_space(
        Space("jt_sparse", dims=("M",), params=[choice("x", tuple(range(1, 401)))],
              constraints=[Constraint("seven", ("x",), "x == 7", only_seven)], revision=1,
              default=lambda ctx: {"x": 7}),
        replace=True,
    )  # fmt: skip
    for seed in range(3):
        study = optuna.create_study()
        searcher = Searcher(space, PROBLEM, LIMITS, TuneSettings(trials=10, seed=seed, strategy="random"))
        first = searcher.propose(study)
        assert isinstance(first, Proposal) and first.config == {"x": 7}, first
        study.tell(first.trial, 1.0)
        assert searcher.propose(study) == "exhausted"


def test_repeats_are_answered_from_history_and_exploration_finds_new_configs():
    space = _picky_space()
    study = optuna.create_study()
    settings = TuneSettings(trials=10, seed=0, strategy="tpe")
    searcher = Searcher(space, PROBLEM, LIMITS, settings)
    seen = []
    while isinstance(proposal := searcher.propose(study), Proposal):
        seen.append(proposal.key)
        study.tell(proposal.trial, 2.0 if "baseline" in proposal.key else 1.0)
    assert proposal == "exhausted"
    # every valid config (x=1..12 under baseline, x=7 under fast) measured exactly once
    assert len(seen) == len(set(seen)) == space.count(PROBLEM, LIMITS) == 13
    cached = [t for t in study.trials if ATTR_CACHED in t.user_attrs]
    assert all(t.value in (1.0, 2.0) for t in cached if t.state == TrialState.COMPLETE)


def test_a_repeat_turns_into_the_fastest_configs_nearest_unmeasured_neighbour():
    """TPE repeating its incumbent makes the next trial a neighbour of the fastest configs (`Space.neighbours`), in a
    fixed order that doesn't depend on the sampler's seed; the repeat itself is free (answered from history)."""
    space = _picky_space()
    picks = []
    for seed in (0, 1):
        study = optuna.create_study()
        searcher = Searcher(space, PROBLEM, LIMITS, TuneSettings(trials=10, seed=seed, strategy="tpe"))
        for config, value in (({"mode": "fast", "x": 7}, 1.0), ({"mode": "baseline", "x": 5}, 2.0)):
            study.enqueue_trial(config)
            proposal = searcher.propose(study)
            assert isinstance(proposal, Proposal) and proposal.config == config
            study.tell(proposal.trial, value)
        study.enqueue_trial({"mode": "fast", "x": 7})  # as TPE does: its incumbent again
        proposal = searcher.propose(study)
        assert isinstance(proposal, Proposal)
        cached = [t for t in study.trials if ATTR_CACHED in t.user_attrs]
        assert len(cached) == 1 and cached[0].value == 1.0
        picks.append(proposal.config)
    # the fastest (fast, x=7): its first neighbour moves the first knob, mode, and keeps x (fast takes only x=7)
    assert picks[0] == picks[1] == {"mode": "baseline", "x": 7}


def test_the_start_puts_the_baseline_first_adapts_refused_priors_and_repeats_nothing(families):
    space = families.SLEEP_SPACE
    prior = Prior({"mode": "fast", "tile": 16, "chunk": 4}, {"kind": "other-world-size", "world_size": 4})
    warm = [{"mode": "fast", "tile": 4, "chunk": 2}, prior, {"mode": "baseline"}]
    configs = initial_configs(space, PROBLEM, LIMITS, warm=warm)
    assert [(s.role, s.config) for s in configs[:3]] == [
        ("baseline", {"mode": "baseline"}),
        ("default", {"mode": "fast", "tile": 1, "chunk": 1}),
        ("warm", {"mode": "fast", "tile": 4, "chunk": 2}),
    ]
    # tile*chunk = 64 breaks the rule here: the prior runs as the valid config nearest to it, and says what moved
    (adapted,) = configs[3:]
    assert adapted.role == "warm" and not space.violations(adapted.config, PROBLEM, LIMITS)
    assert adapted.source["kind"] == "other-world-size" and adapted.source["adapted"]
    assert set(adapted.source["adapted"]) <= {"tile", "chunk"} and adapted.config["mode"] == "fast"
    assert len(initial_configs(space, PROBLEM, LIMITS, exhaustive=True)) == 13


def test_the_space_s_seeds_come_after_the_warm_configs_then_every_mode_left_and_repeat_none():
    from jointtune.search_spaces import DeviceLimits, get_space

    space, limits = get_space("gemm_rs"), DeviceLimits.nominal_hopper()
    problem = space.make_problem("64x8192x8192", dtype="bf16", world_size=2)
    seeds = space.seeds(problem, limits)
    configs = initial_configs(space, problem, limits, warm=[seeds[1]])
    assert [s.role for s in configs] == ["baseline", "default", "warm", "seed", "seed", "mode", "mode", "mode"]
    # a warm config is not tried again as a seed, nor the first seed, which is the default (the barrier launch)
    assert configs[1].config == seeds[0]
    assert [s.config for s in configs[2:5]] == [seeds[1], seeds[2], seeds[3]]
    modes = [s.config["mode"] for s in configs]
    assert sorted(set(modes)) == sorted(space.modes)  # every mode, push twice (the warm LL seed and the flagged one)
    assert len({json.dumps(s.config, sort_keys=True) for s in configs}) == len(configs)


def test_sweeps_are_registered_in_the_storage(families, sqlite_url):
    storage = open_storage(sqlite_url)
    job = Job.of("jt_sleep", PROBLEM, TuneSettings(trials=3))
    register_sweep(storage, "nightly", {"cpu": [job]}, imports=["jt_families"])
    sweep = load_sweep(storage, "nightly")
    assert sweep.jobs("cpu") == (job,) and sweep.imports == ("jt_families",)
    assert sweep_names(storage) == ["nightly"]
    with pytest.raises(TuningError, match="sweep: 'weekly' is not registered in this storage; registered: nightly"):
        load_sweep(storage, "weekly")
    with pytest.raises(TuningError, match="profile: sweep 'nightly' has no 'gpu' profile; it has: cpu"):
        sweep.jobs("gpu")
    with pytest.raises(TuningError, match="profile: 'tpu' is not allowed"):
        register_sweep(storage, "bad", {"tpu": [job]})


def test_groups_are_planned_per_world_size_on_gpus_and_as_local_worlds_on_cpus():
    from jointtune.autotune.workers.runner import plan_groups

    jobs = [Job.of("jt_sleep", Problem.of({"M": 64}, dtype="float32", world_size=w), TuneSettings()) for w in (2, 4, 2)]
    phases = plan_groups(jobs, url="sqlite:////tmp/x.db", gpus=8)
    assert [(p.world_size, len(p.specs)) for p in phases] == [(2, 4), (4, 2)]
    assert [s.device_offset for s in phases[0].specs] == [0, 2, 4, 6]
    assert all(s.world_kind == "cuda" and s.nprocs == 4 and len(s.jobs) == 1 for s in phases[1].specs)
    assert len({s.group_id for p in phases for s in p.specs}) == 6
    (cpu,) = plan_groups(jobs, url="sqlite:////tmp/x.db", gpus=0, groups=2)
    assert [(s.world_kind, s.nprocs, len(s.jobs)) for s in cpu.specs] == [("local", 1, 3)] * 2
    with pytest.raises(TuningError, match="world_size: 4 is not allowed on this node; it has 2 GPU"):
        plan_groups(jobs, url="sqlite:////tmp/x.db", gpus=2)


def test_patience_waits_for_the_start_and_says_why_it_stopped():
    study = optuna.create_study()
    for value in (1.0, 2.0, 3.0):
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"jt_config": f'{{"x":{value}}}'}))
    study.enqueue_trial({"x": 4})  # the start's last config, not measured yet
    settings = TuneSettings(trials=10, patience=2)
    waiting = StudyState.of(study.get_trials())
    assert waiting.since_best == 2 and waiting.done(settings) is None and waiting.explain(settings) is None
    trial = study.ask()
    study.tell(trial, 5.0)
    state = StudyState.of(study.get_trials())
    assert state.done(settings) == "patience"
    why = "patience: 3 trials since the best (trial 0, 1.0 µs) without a faster one (patience 2)"
    assert state.explain(settings) == why
    assert StudyState.of(study.get_trials()).explain(TuneSettings(trials=4)) == "used its budget of 4 trials"
