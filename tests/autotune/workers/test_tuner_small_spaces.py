"""Sub-spaces smaller than the budget: every claimed trial runs, every config is measured, the study ends "exhausted".

A claim ahead (`lookahead`) in a space of a few configs takes the last new one before the current trial
has run; the next claim then finds nothing new. That must not stop the study while claimed trials are
still to run (in this group or another): they are the configs that have no result yet.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from jointtune.autotune.tuner.results import collect
from jointtune.autotune.tuner.search import Proposal
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_OWNER, open_storage, trial_config, trial_kind
from jointtune.autotune.workers import coordinator as coordinator_module
from jointtune.autotune.workers.control import SoloControl
from jointtune.autotune.workers.coordinator import Coordinator, GroupInfo, GroupOptions
from jointtune.autotune.workers.executor import RankExecutor
from jointtune.autotune.workers.group import GroupSpec
from jointtune.autotune.workers.supervisor import Supervisor
from jointtune.hardware import detect
from jointtune.search_spaces import Problem, canonical_json

FAST = TuneSettings(warmup=0, iters=2, seed=1)
#: long grace: a group's live trials never go stale while another group looks at them
OPTIONS = GroupOptions(heartbeat_s=1, grace_s=60, poll_s=0.05)
ONE = {"mode": "baseline"}  # the sub-space is the baseline alone
THREE = {"mode": "fast", "tile": 4, "chunk": [1, 2]}  # the baseline (kept by every sub-space) and two configs
THREE_CONFIGS = [{"mode": "baseline"}, {"mode": "fast", "tile": 4, "chunk": 1}, {"mode": "fast", "tile": 4, "chunk": 2}]


def sleep_job(restrict: dict[str, Any], **changes: Any) -> Job:
    settings = FAST.replace(restrict=restrict, **changes)
    return Job.of("jt_sleep", Problem.of({"M": 64}, dtype="float32", world_size=2), settings)


def coordinator(url: str, job: Job, group: str) -> Coordinator:
    executor = RankExecutor(SoloControl(), world_kind="local")
    return Coordinator(url=url, jobs=lambda: [job], group=GroupInfo(group, "local", 1), control=SoloControl(),
                       executor=executor, options=OPTIONS)  # fmt: skip


def tune(url: str, job: Job) -> None:
    c = coordinator(url, job, "g-small")
    try:
        c.run()
    finally:
        c.executor.close()


def result_of(url: str, job: Job):
    (result,) = collect(open_storage(url), [job], hardware_id=detect().hardware_id)
    return result


def assert_measured_once_each(url: str, job: Job, configs: list[dict[str, Any]]) -> None:
    """Every config of the sub-space measured exactly once, nothing claimed and dropped, the study over."""
    result = result_of(url, job)
    measured = [trial_config(t) for t in result.state.counted]
    assert sorted(map(canonical_json, measured)) == sorted(map(canonical_json, configs))
    assert {trial_kind(t) for t in result.state.counted} == {"ok"}
    interrupted = [(t.number, t.params) for t in result.trials if trial_kind(t) == "interrupted"]
    assert interrupted == []  # a claimed trial given back unrun is FAIL ("interrupted")
    assert result.done_reason == "exhausted" and not result.failed_entirely


@pytest.mark.parametrize("lookahead", [1, 2])
def test_a_one_config_sub_space_measures_its_config_though_a_claim_ahead_finds_nothing(families, sqlite_url, lookahead):
    job = sleep_job(ONE, trials=3, lookahead=lookahead)
    tune(sqlite_url, job)
    assert_measured_once_each(sqlite_url, job, [ONE])
    record = families.stored_best(sqlite_url, families.SleepFamily())
    assert record is not None and record.config == ONE


@pytest.mark.parametrize("lookahead", [1, 2])
def test_every_config_of_a_sub_space_smaller_than_the_budget_is_measured(families, sqlite_url, lookahead):
    job = sleep_job(THREE, trials=5, lookahead=lookahead)
    tune(sqlite_url, job)
    assert_measured_once_each(sqlite_url, job, THREE_CONFIGS)
    assert result_of(sqlite_url, job).best_config == {"mode": "fast", "tile": 4, "chunk": 2}


def test_a_group_of_real_rank_processes_measures_every_config_of_a_small_sub_space(families, sqlite_url):
    job = sleep_job(THREE, trials=5, lookahead=2)
    spec = GroupSpec(url=sqlite_url, group_id="g-procs", jobs=(job,), imports=("jt_families",), options=OPTIONS)
    supervisor = Supervisor(spec)
    supervisor.start()
    supervisor.wait()
    assert supervisor.restarts == 0
    assert_measured_once_each(sqlite_url, job, THREE_CONFIGS)


class _SignallingTime:
    """The coordinator module's `time`, which says when a coordinator starts waiting for other groups."""

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.waiting.set()
        time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_group_that_finds_nothing_new_waits_for_the_trials_another_group_holds(families, sqlite_url, monkeypatch):
    job = sleep_job({"mode": "fast", "tile": 4, "chunk": 1}, trials=5)  # the baseline and one config
    holder, latecomer = coordinator(sqlite_url, job, "g-holder"), coordinator(sqlite_url, job, "g-late")
    clock = _SignallingTime()
    monkeypatch.setattr(coordinator_module, "time", clock)
    thread = threading.Thread(target=latecomer.run, name="latecomer", daemon=True)
    try:
        h = holder.handle(job)
        claimed = [holder.claim(h), holder.claim(h)]  # both configs: the holder's current trial and its claim ahead
        assert all(isinstance(p, Proposal) for p in claimed)

        assert latecomer.claim(latecomer.handle(job)) is None  # nothing new while they run...
        assert h.state().done(job.settings) is None  # ...which doesn't stop the study under the holder
        thread.start()
        # the latecomer waits for them (no claim after claim in a loop); nothing of the holder's has run yet
        assert clock.waiting.wait(timeout=120)
        assert h.state().kinds["running"] == 2

        holder.executor.start_study(job)
        for p in claimed:
            holder.finish(h, p, holder.executor.execute(p.config, deadline_s=holder.deadline_s(h)))
        thread.join(timeout=120)
        assert not thread.is_alive()  # once they ended the latecomer found the study exhausted, and left
    finally:
        holder.heartbeat.close()
        holder.executor.close()
        latecomer.executor.close()
    assert_measured_once_each(sqlite_url, job, [{"mode": "baseline"}, {"mode": "fast", "tile": 4, "chunk": 1}])
    owners = {t.user_attrs[ATTR_OWNER]["group"] for t in result_of(sqlite_url, job).state.counted}
    assert owners == {"g-holder"}
