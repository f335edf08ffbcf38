"""One trial count for a tuned shape, wherever it is shown: the sweep's table, `jointtune db list`, the
REST lookup's provenance, a bundle (served and exported) and the dashboard all read the record's `trials`,
which the tuner keeps at its study's count (`StudyState.trial_count`), also when the best config was found
early: here the third trial (a warm start from a nearby tuned shape) is best, and eight are run.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

from rich.console import Console

from jointtune.autotune.tuner.results import collect
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import open_storage, trial_kind
from jointtune.autotune.workers.control import SoloControl
from jointtune.autotune.workers.coordinator import Coordinator, GroupInfo, GroupOptions
from jointtune.autotune.workers.executor import RankExecutor
from jointtune.autotune.workers.sweeps.progress import summary_table
from jointtune.cli import main
from jointtune.db import NewRecord, RecordKey, open_store
from jointtune.hardware import detect
from jointtune.search_spaces import Problem

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))
from jt_server import serve

BEST = {"mode": "fast", "tile": 4, "chunk": 2}
TRIALS = 8


def _tune(url: str, job: Job) -> None:
    executor = RankExecutor(SoloControl(), world_kind="local")
    try:
        Coordinator(
            url=url,
            jobs=lambda: [job],
            group=GroupInfo("g-views", "local", 1),
            control=SoloControl(),
            executor=executor,
            options=GroupOptions(heartbeat_s=1, grace_s=3, poll_s=0.05),
        ).run()
    finally:
        executor.close()


def _column(text: str, header: str, row_start: str) -> str:
    """The cell under `header` in the rich table row that starts with `row_start`."""
    rows = [[cell.strip() for cell in re.split("[│┃]", line)] for line in text.splitlines() if re.search("[│┃]", line)]
    names = next(row for row in rows if header in row)
    return next(row for row in rows if row[1].startswith(row_start))[names.index(header)]


def test_every_view_shows_the_studys_trial_count(families, sqlite_url: str, tmp_path: Path) -> None:
    hardware_id = detect().hardware_id
    problem = Problem.of({"M": 64}, dtype="float32", world_size=2)
    job = Job.of("jt_sleep", problem, TuneSettings(trials=TRIALS, warmup=0, iters=2, seed=1, lookahead=0))
    family = families.SleepFamily()
    near = NewRecord(kernel="jt_sleep", kernel_version=family.version, space_version="s1",
                     shape={"M": 32}, dtype="float32", world_size=2, hardware_id=hardware_id, triton_version="3.6",
                     config=BEST, latency_p50_us=500.0, trials=5)  # fmt: skip
    open_store(sqlite_url).upsert_record(near)  # the warm start makes BEST the third trial
    _tune(sqlite_url, job)

    (result,) = collect(open_storage(sqlite_url), [job], hardware_id=hardware_id)
    measured = [t for t in result.trials if trial_kind(t) == "ok"]
    assert result.counted == TRIALS and result.best_config == BEST
    assert result.state.best.number < TRIALS - 1  # found early: a count taken then would say less
    (record,) = open_store(sqlite_url).list_records(RecordKey.any(kernel="jt_sleep", shape={"M": 64}))
    assert record.trials == TRIALS and record.study_name == result.study_name and len(measured) <= TRIALS

    # the sweep's tuned table
    console = Console(width=250, record=True)
    console.print(summary_table([result]))
    assert _column(console.export_text(), "trials", "jt_sleep") == str(TRIALS)

    # jointtune db list
    with contextlib.redirect_stdout(io.StringIO()) as out:
        main(["db", "list", "--db", sqlite_url])
    assert _column(out.getvalue(), "trials", str(record.id)) == str(TRIALS)

    # jointtune export
    bundle_file = tmp_path / "bundle.json"
    main(["export", "--db", sqlite_url, "--hardware", hardware_id, "-o", str(bundle_file)])
    exported = json.loads(bundle_file.read_text())["records"]
    assert [r["trials"] for r in exported if r["shape"] == {"M": 64}] == [TRIALS]

    for live in serve(sqlite_url):
        with live.client() as http:
            query = {"M": 64, "dtype": "float32", "world_size": 2, "hardware_id": hardware_id, "timing": record.timing}
            lookup = http.get("/v1/configs/jt_sleep", params=query).json()
            assert lookup["provenance"]["trials"] == TRIALS, lookup
            page = http.get(f"/v1/bundles/{hardware_id}").json()
            assert [r["trials"] for r in page["records"] if r["shape"] == {"M": 64}] == [TRIALS]
            html = http.get("/dashboard").text
        cell = re.search(rf'<td class="num">(\d+)</td><td class="muted">{re.escape(result.study_name)}<', html)
        assert cell is not None and int(cell.group(1)) == TRIALS
