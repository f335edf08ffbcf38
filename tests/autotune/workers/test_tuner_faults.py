"""Failures are results: injected faults in real rank processes, supervised and restarted."""

from __future__ import annotations

import collections

from jointtune.autotune.tuner.results import collect
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_DETAIL, ATTR_REASON, open_storage, trial_config
from jointtune.autotune.workers.coordinator import GroupOptions
from jointtune.autotune.workers.group import GroupSpec
from jointtune.autotune.workers.supervisor import Supervisor
from jointtune.hardware import detect
from jointtune.search_spaces import Problem

# short watchdogs: the hanging config is given up ~1.5 s after it starts
QUICK = TuneSettings(
    strategy="exhaustive",
    warmup=0,
    iters=2,
    watchdog_compile_s=1.0,
    watchdog_factor=5.0,
    watchdog_slack_s=0.5,
    first_trial_timeout_s=5.0,
)


def test_every_fault_is_a_recorded_result_and_the_sweep_finds_the_best(families, sqlite_url):
    job = Job.of("jt_faulty", Problem.of({"M": 64}, dtype="float32", world_size=2), QUICK)
    spec = GroupSpec(
        url=sqlite_url,
        group_id="g-faults",
        jobs=(job,),
        imports=("jt_families",),
        options=GroupOptions(heartbeat_s=1, grace_s=3, poll_s=0.1),
    )
    supervisor = Supervisor(spec)
    supervisor.start()
    supervisor.wait()
    assert supervisor.restarts >= 2  # the hang and the kill each took the group down

    (result,) = collect(open_storage(sqlite_url), [job], hardware_id=detect().hardware_id)
    assert result.done_reason == "exhausted"
    by_variant = {trial_config(t).get("variant", "baseline") + str(trial_config(t).get("tile", "")): t
                  for t in result.state.counted}  # fmt: skip
    reasons = {name: t.user_attrs.get(ATTR_REASON) for name, t in by_variant.items()}
    assert reasons == {
        "baseline": None,
        "ok1": None,
        "ok2": None,
        "ok4": None,
        "ok8": None,
        "raise1": "compile",
        "hang1": "timeout",
        "kill1": "crash",
        "wrong1": "incorrect",
    }
    assert "out of resources" in by_variant["raise1"].user_attrs[ATTR_DETAIL]
    assert "tolerance" in by_variant["wrong1"].user_attrs[ATTR_DETAIL]
    assert collections.Counter(result.state.failures) == {"compile": 1, "timeout": 1, "crash": 1, "incorrect": 1}
    assert result.best_config == {"mode": "fast", "tile": 4, "variant": "ok"}
    record = families.stored_best(sqlite_url, families.FaultyFamily())
    assert record is not None and record.config == result.best_config
    assert record.speedup > 3
