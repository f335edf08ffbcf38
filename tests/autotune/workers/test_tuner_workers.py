"""Many groups, one shared PostgreSQL storage: torchrun workers, a killed group, recovery paths."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from jt_procs import children, parent
from optuna.trial import TrialState

from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import (
    ATTR_DEADLINE,
    ATTR_OWNER,
    ATTR_REASON,
    ATTR_RETRY_OF,
    open_storage,
    quiet_optuna,
    trial_config,
    trial_kind,
)
from jointtune.autotune.workers.recovery import Owner, host_id, recover_study
from jointtune.autotune.workers.sweeps.registry import load_sweep, register_sweep
from jointtune.search_spaces import Problem, canonical_json

BIN = Path(sys.executable).parent
WORK = TuneSettings(trials=6, warmup=0, iters=2, seed=5, lookahead=0)


def _kill_group(agent: subprocess.Popen) -> None:
    """torchrun starts each rank in a session of its own: kill the ranks by pid, then the agent."""
    ranks = children(agent.pid)
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()


def _worker(url: str, env: dict[str, str]) -> subprocess.Popen:
    command = [
        str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "--no-python", str(BIN / "jointtune"),
        "worker", "--storage", url, "--sweep", "workers-test", "--profile", "cpu", "--heartbeat", "1", "--grace", "3",
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _studies(storage) -> list[optuna.Study]:
    names = [s.study_name for s in storage.get_all_studies() if s.study_name.startswith("jointtune:jt_sleep")]
    return [optuna.load_study(study_name=n, storage=storage) for n in names]


@pytest.mark.postgres
@pytest.mark.slow
def test_two_torchrun_groups_share_the_work_and_survive_a_killed_group(families, pg_url, subprocess_env):
    jobs = [Job.of("jt_sleep", Problem.of({"M": m}, dtype="float32", world_size=2), WORK) for m in (1600, 1280)]
    storage = open_storage(pg_url)
    register_sweep(storage, "workers-test", {"cpu": jobs}, imports=["jt_families"])
    assert load_sweep(storage, "workers-test").jobs("cpu") == tuple(jobs)

    victim, survivor = _worker(pg_url, subprocess_env), _worker(pg_url, subprocess_env)
    owners: dict[int, int] = {}  # rank-0 pid -> its torchrun pid
    try:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the victim group never held a trial"
            assert victim.poll() is None and survivor.poll() is None
            held = []
            for study in _studies(storage):
                for trial in study.get_trials(deepcopy=False):
                    pid = (trial.user_attrs.get(ATTR_OWNER) or {}).get("pid")
                    if pid is not None and pid not in owners:
                        owners[pid] = parent(pid) or 0
                    running = trial.state == TrialState.RUNNING and ATTR_DEADLINE in trial.user_attrs
                    if pid is not None and running and owners[pid] == victim.pid:
                        held.append(trial.number)
            if held and survivor.pid in owners.values():
                break
            time.sleep(0.05)
        _kill_group(victim)  # every rank and the agent, mid-trial

        out, _ = survivor.communicate(timeout=150)
        assert survivor.returncode == 0, out
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                _kill_group(proc)

    for study in _studies(storage):
        trials = study.get_trials(deepcopy=False)
        counted = [t for t in trials if trial_kind(t) in ("ok", "failed")]
        assert len(counted) == WORK.trials  # every slot of the budget used exactly once
        keys = [canonical_json(trial_config(t)) for t in counted]
        assert len(set(keys)) == len(keys)  # no config measured twice
        interrupted = [t for t in trials if trial_kind(t) == "interrupted"]
        retried = collections.Counter(t.user_attrs[ATTR_RETRY_OF] for t in counted if ATTR_RETRY_OF in t.user_attrs)
        assert retried == collections.Counter(t.number for t in interrupted)  # each redone once
        assert not [t for t in trials if t.state == TrialState.RUNNING]
    every = [t for study in _studies(storage) for t in study.get_trials(deepcopy=False)]
    dump = [(t.number, t.state.name, t.user_attrs) for t in every]
    assert any(trial_kind(t) == "interrupted" for t in every), (held, dump, out)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _claim(study: optuna.Study, owner: Owner, *, deadline: float | None = None) -> optuna.Trial:
    with quiet_optuna():
        trial = study.ask()
    trial.suggest_categorical("x", [1, 2, 3])
    trial.set_user_attr(ATTR_OWNER, owner.to_json())
    if deadline is not None:
        trial.set_user_attr(ATTR_DEADLINE, deadline)
    study._storage.record_heartbeat(trial._trial_id)
    return trial


def test_dead_owners_on_this_host_are_resolved_at_once(sqlite_url):
    storage = open_storage(sqlite_url, heartbeat_interval=1, grace_period=30)
    study = optuna.create_study(study_name="recovery", storage=storage)
    dead = _dead_pid()
    now = time.time()
    mine_late = _claim(study, Owner(host_id(), dead, None, "me"), deadline=now - 5)
    mine_early = _claim(study, Owner(host_id(), dead, None, "me"), deadline=now + 60)
    mine_unstarted = _claim(study, Owner(host_id(), dead, None, "me"))
    theirs = _claim(study, Owner(host_id(), dead, None, "other"), deadline=now + 60)
    alive = _claim(study, Owner.current("other"), deadline=now + 60)
    remote = _claim(study, Owner("elsewhere/0000", 1, None, "remote"), deadline=now + 60)

    resolved = dict(recover_study(study, group="me", death_time=now))
    assert resolved == {
        mine_late.number: "timeout",
        mine_early.number: "crash",
        mine_unstarted.number: "interrupted",
        theirs.number: "interrupted",
    }
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert by_number[mine_early.number].user_attrs[ATTR_REASON] == "crash"
    assert by_number[mine_early.number].state == TrialState.PRUNED
    assert by_number[theirs.number].state == TrialState.FAIL
    assert by_number[alive.number].state == by_number[remote.number].state == TrialState.RUNNING
    retries = [t for t in by_number.values() if ATTR_RETRY_OF in t.user_attrs]
    assert sorted(t.user_attrs[ATTR_RETRY_OF] for t in retries) == sorted([mine_unstarted.number, theirs.number])
    for retry in retries:
        assert retry.state == TrialState.WAITING
        assert retry.system_attrs["fixed_params"] == by_number[retry.user_attrs[ATTR_RETRY_OF]].params


@pytest.mark.postgres
def test_a_silent_group_on_another_node_goes_stale_and_its_trial_is_retried(pg_url):
    storage = open_storage(pg_url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="stale", storage=storage)
    remote = _claim(study, Owner("elsewhere/0000", 12345, None, "remote"), deadline=time.time() + 60)
    assert recover_study(study, group="me") == []  # fresh heartbeat: left alone
    time.sleep(2.5)
    assert recover_study(study, group="me") == [(remote.number, "stale")]
    trials = study.get_trials(deepcopy=False)
    assert trials[remote.number].state == TrialState.FAIL
    (retry,) = [t for t in trials if t.user_attrs.get(ATTR_RETRY_OF) == remote.number]
    assert retry.state == TrialState.WAITING
    assert retry.system_attrs["fixed_params"] == trials[remote.number].params
