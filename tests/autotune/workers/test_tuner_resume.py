"""Kill -9 a sweep mid-trial and run it again: it goes on where it was, nothing lost or repeated."""

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
from optuna.trial import TrialState

from jointtune.autotune.tuner.studies import (
    ATTR_DEADLINE,
    ATTR_RETRY_OF,
    open_storage,
    trial_config,
    trial_kind,
)
from jointtune.search_spaces import canonical_json

SWEEP = """
name: resume-test
imports: [jt_families]
profiles:
  cpu:
    tuning: {seed: 3, warmup: 1, iters: 3, n_startup: 3}
    jobs:
      - kernel: jt_sleep
        shapes: ["320"]
        dtypes: [float32]
        world_size: 2
        trials: 13    # every valid config of jt_sleep: both runs must end on the true best
"""
SCALE = 320 / 64  # jt_sleep's latencies scale with M
JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]


def _study(url: str) -> optuna.Study | None:
    storage = open_storage(url)
    names = [s.study_name for s in storage.get_all_studies() if s.study_name.startswith("jointtune:jt_sleep")]
    return optuna.load_study(study_name=names[0], storage=storage) if names else None


def _counted(url: str) -> list[optuna.trial.FrozenTrial]:
    study = _study(url)
    assert study is not None
    return [t for t in study.get_trials(deepcopy=False) if trial_kind(t) in ("ok", "failed")]


def _sweep(sweep: Path, url: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*JOINTTUNE, "sweep", str(sweep), "--db", url, "--profile", "cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: we kill the CLI and its ranks together
    )


def _kill_mid_trial(proc: subprocess.Popen, url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        study = _study(url) if Path(url.removeprefix("sqlite:///")).exists() else None
        if study is not None:
            trials = study.get_trials(deepcopy=False)
            counted = [t for t in trials if trial_kind(t) in ("ok", "failed")]
            running = [t for t in trials if t.state == TrialState.RUNNING and ATTR_DEADLINE in t.user_attrs]
            if len(counted) >= 3 and running:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return
        time.sleep(0.05)
    raise AssertionError("the sweep never had a trial running")


def test_a_killed_sweep_resumes_and_ends_like_an_uninterrupted_one(families, tmp_path, subprocess_env):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    clean, killed = f"sqlite:///{tmp_path / 'clean.db'}", f"sqlite:///{tmp_path / 'killed.db'}"
    reference = _sweep(sweep, clean, subprocess_env)
    victim = _sweep(sweep, killed, subprocess_env)
    _kill_mid_trial(victim, killed)
    interrupted = [t for t in _study(killed).get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    assert len(interrupted) >= 1
    done_before = {t.number for t in _counted(killed)}

    resumed = _sweep(sweep, killed, subprocess_env)
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out
    out, _ = reference.communicate(timeout=120)
    assert reference.returncode == 0, out

    after = _counted(killed)
    # no completed trial lost, none repeated, the budget spent exactly
    assert done_before <= {t.number for t in after}
    assert len(after) == 13
    keys = [canonical_json(trial_config(t)) for t in after]
    assert len(set(keys)) == len(keys)
    # the interrupted trials failed (not counted) and their configs ran once, later
    study = _study(killed)
    trials = study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert {t.number for t in failed} == {t.number for t in interrupted}
    retries = collections.Counter(t.user_attrs[ATTR_RETRY_OF] for t in trials if ATTR_RETRY_OF in t.user_attrs)
    assert retries == collections.Counter(t.number for t in failed)  # each enqueued again, once
    # a claimed trial's config then ran once (a kill mid-proposal may also catch an invalid one)
    claimed = {t.number for t in failed if ATTR_DEADLINE in t.user_attrs}
    assert claimed <= {t.user_attrs.get(ATTR_RETRY_OF) for t in after}
    # same seeded start, the same measurements and the same best as the run nobody killed. Latencies
    # are jt_sleep's simulated ones to the nanosecond (jt_families.SimulatedClock), however loaded the
    # machine; the killed run's later suggestions differ (its history holds the interrupted trials),
    # and the budget covers the whole space, so both runs measure every config and end on the true best
    clean_trials = _counted(clean)
    assert [canonical_json(trial_config(t)) for t in clean_trials][:3] == keys[:3]
    for trial in (*after, *clean_trials):
        assert trial.value == pytest.approx(families.sleep_cost_ms(trial_config(trial)) * SCALE * 1e3, rel=1e-6)
    assert {canonical_json(trial_config(t)) for t in clean_trials} == set(keys)
    best = min((t for t in after if t.value is not None), key=lambda t: t.value)
    clean_best = min((t for t in clean_trials if t.value is not None), key=lambda t: t.value)
    assert trial_config(best) == trial_config(clean_best) == {"mode": "fast", "tile": 4, "chunk": 2}
