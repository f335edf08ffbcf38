"""A tuning run in this process (one local group, no spawning) for the tuner's tests, and the same run as a script.

As a script it tunes the job given as JSON into a database and prints the configs its counted trials ran, one
canonical JSON per line, so a test can compare a tune in a fresh process (its own PYTHONHASHSEED, its own imports)
with one in the test's process:

    python -m jt_tuning sqlite:////tmp/a.db '{"kernel": "jt_sim_decode", ...}'
"""

from __future__ import annotations

import json
import sys
from typing import Any

from jointtune.autotune.tuner.results import JobResult, collect
from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.tuner.studies import open_storage, trial_config
from jointtune.autotune.workers.compiler import CompilePool
from jointtune.autotune.workers.control import SoloControl
from jointtune.autotune.workers.coordinator import Coordinator, GroupInfo, GroupOptions
from jointtune.autotune.workers.executor import RankExecutor
from jointtune.hardware import detect
from jointtune.search_spaces import canonical_json


def tune(url: str, *jobs: Job, group: str = "g-test", compiler: CompilePool | None = None) -> None:
    """Run `jobs` to their end in this process: one local group, rank 0 only (compiling ahead in `compiler`'s worker
    processes where given, else on threads)."""
    executor = RankExecutor(SoloControl(), world_kind="local", compiler=compiler)
    try:
        Coordinator(
            url=url,
            jobs=lambda: jobs,
            group=GroupInfo(group, "local", 1),
            control=SoloControl(),
            executor=executor,
            options=GroupOptions(heartbeat_s=1, grace_s=3, poll_s=0.05),
        ).run()
    finally:
        executor.close()


def result_of(url: str, job: Job) -> JobResult:
    (result,) = collect(open_storage(url), [job], hardware_id=detect().hardware_id)
    return result


def ran(result: JobResult) -> list[str]:
    """The configs its counted trials ran, in trial order, as canonical JSON."""
    return [canonical_json(trial_config(t)) for t in sorted(result.state.counted, key=lambda t: t.number)]


def main(argv: list[str]) -> None:
    import jt_families  # noqa: F401  (registers the test families and the simulated clock)

    url, data = argv
    job = Job.from_json(json.loads(data))
    tune(url, job)
    for config in ran(result_of(url, job)):
        print(config)


def job_json(job: Job) -> str:
    data: dict[str, Any] = job.to_json()
    return json.dumps(data)


if __name__ == "__main__":
    main(sys.argv[1:])
