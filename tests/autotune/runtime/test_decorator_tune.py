"""`on_miss="tune"`: a short study on a miss, saved to the store and published to the service."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_decorator_helpers import World, make_launcher, source_of

from jointtune.autotune.runtime.lookup import reset_warnings, wait_for_publishes
from jointtune.autotune.tuner.settings import TuneSettings
from jointtune.db import RecordKey, open_store
from jointtune.hardware import current_limits
from jointtune.search_spaces import get_space
from jointtune.timings import measured_as

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))
from jt_server import WRITE, serve

TINY = TuneSettings(trials=3, warmup=0, iters=2, warm_start=0, lookahead=0, seed=3)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOINTTUNE_MODE", "JOINTTUNE_SERVER", "JOINTTUNE_PRINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JOINTTUNE_TOKEN", WRITE)
    reset_warnings()


def test_tuning_in_the_interpreter_runs_one_thread_and_gives_the_callers_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On busy cores torch's second thread made 1 baseline call in 100 a scheduler slice long, which eager timing
    read as the baseline: the study runs one thread, and the caller's setting is back once it ends."""
    settings: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (settings.append(n), real(n)))
    before = torch.get_num_threads()
    real(2)
    try:
        launch = make_launcher(f"sqlite:///{tmp_path / 'local.db'}", on_miss="tune", tune_settings=TINY)
        launch(torch.ones(16), world=World(2))
        assert source_of(launch, 16) == "tune" and settings == [1, 2] and torch.get_num_threads() == 2
    finally:
        real(before)


def test_tune_on_a_miss_saves_publishes_and_is_found_next_time(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'local.db'}"
    service_db = f"sqlite:///{tmp_path / 'service.db'}"
    for server in serve(service_db):
        launch = make_launcher(db, on_miss="tune", tune_settings=TINY, server=server.url)
        launch(torch.ones(32), world=World(2))
        config = launch.seen[-1]
        assert source_of(launch, 32) == "tune"
        space = get_space("jt_sleep")
        problem = space.make_problem({"M": 32}, dtype="float32", world_size=2)
        assert not space.violations(config, problem, current_limits())
        (record,) = open_store(db).list_records(RecordKey.any(kernel="jt_sleep"))
        assert record.config == config and record.trials == 3 and record.study_name.startswith("jointtune:jt_sleep")
        # tuned the way the call runs: eager, which in the CPU interpreter is what every policy is there, interp
        measured = measured_as("eager", record.hardware_id)
        assert record.timing == measured and record.study_name.endswith(":teager") == (measured == "eager")
        assert wait_for_publishes(60)  # a publish slower than the lookup deadline goes on off the call path
        (published,) = open_store(service_db).list_records(RecordKey.any(kernel="jt_sleep"))
        assert published.config == config and published.timing == measured
        again = make_launcher(db, on_miss="error")
        again(torch.ones(32), world=World(2))
        assert again.seen[-1] == config and source_of(again, 32) == "store" + (measured != "eager") * " [interp record]"
