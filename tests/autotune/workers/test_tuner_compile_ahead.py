"""Compiling ahead in worker processes (`workers/compiler.py`): what is sent ahead, failures that stay with their
config, and picks that don't move. One pool of real worker processes serves the module; the tunes run in this
process (one local group), the test families' `standin_launches` note in a file what a worker built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jt_tuning import ran, result_of, tune

from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import ATTR_DETAIL, ATTR_REASON, ATTR_ROLE, trial_config, trial_kind
from jointtune.autotune.workers.compiler import CompilePool
from jointtune.search_spaces import Problem, canonical_json, get_space

# no final round (`finalists`): these tests count what each trial compiled and ran, and a final round runs configs again
FAST = TuneSettings(warmup=0, iters=2, seed=3, final_rounds=0)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """A one-process compile pool, its workers' compile log and crash marker (their environment is set at spawn)."""
    where = tmp_path_factory.mktemp("compile-pool")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JT_COMPILE_LOG", str(where / "built.jsonl"))
        env.setenv("JT_COMPILE_CRASH", str(where / "crashed"))
        compiler = CompilePool(1, imports=("jt_families",))
        try:
            yield compiler, where
        finally:
            compiler.close()


def _phases(path: Path, phase: str) -> list[dict]:
    lines = [json.loads(text) for text in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["phase"] == phase]


def test_what_does_not_depend_on_results_goes_ahead_at_once_and_the_picks_do_not_move(
    families, tmp_path, monkeypatch, pool
):
    compiler, _ = pool
    problem = get_space("flash_decode").make_problem("8x32x8x32768x128", dtype="bf16", world_size=2)
    job = Job.of("jt_sim_decode", problem, FAST.replace(trials=9, n_startup=6))  # start 4, random 2, TPE 3
    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv("JOINTTUNE_PHASES", str(log))
    with_pool = f"sqlite:///{tmp_path / 'pool.db'}"
    tune(with_pool, job, compiler=compiler)
    monkeypatch.delenv("JOINTTUNE_PHASES")
    on_threads = f"sqlite:///{tmp_path / 'threads.db'}"
    tune(on_threads, job)
    # the same trials in the same order, so the same pick: compiling ahead changes what runs when, never what runs
    first, second = result_of(with_pool, job), result_of(on_threads, job)
    assert ran(first) == ran(second) and first.counted == 9
    assert first.best_config == second.best_config
    # the start (the baseline and one config per mode) and the sampler's two random draws after it went to the pool
    # with the first trial; each config that ran went once
    start = [canonical_json(trial_config(t)) for t in first.state.counted if ATTR_ROLE in t.user_attrs]
    ahead = [(canonical_json(line["config"]), line["trial"]) for line in _phases(log, "ahead")]
    assert len(start) == 4 and ran(first)[:4] == start
    assert {config for config, at in ahead if at == 0} == set(ran(first)[:6])
    assert sorted(config for config, _ in ahead) == sorted(set(ran(first)))
    # every trial's phases are in the log, in order
    assert [line["trial"] for line in _phases(log, "measure")] == list(range(1, 10))


def test_a_worker_builds_each_config_once_and_the_rank_loads_it_before_its_check(families, sqlite_url, pool):
    compiler, where = pool
    families.PRECOMPILED.clear()
    (where / "crashed").touch()  # no worker dies in this test: the next one kills one on purpose
    job = Job.of("jt_sleep", Problem.of({"M": 48}, dtype="float32", world_size=2), FAST.replace(trials=6))
    tune(sqlite_url, job, compiler=compiler)
    result = result_of(sqlite_url, job)
    assert result.counted == 6
    built = [canonical_json(c) for c in families.compile_log(str(where / "built.jsonl"), "jt_sleep", 48)]
    assert sorted(built) == sorted(ran(result)) and len(set(built)) == len(built)
    # each rank loads what the pool built (the family's `precompile`), in trial order, once
    assert [canonical_json(c) for c in families.PRECOMPILED] == ran(result)


def test_a_config_that_fails_to_compile_in_a_worker_fails_alone_and_a_dead_worker_costs_nothing(
    families, sqlite_url, pool
):
    compiler, where = pool
    (where / "crashed").unlink(missing_ok=True)  # the first worker to build a tile=2 config dies
    restrict = {"mode": ["fast"], "tile": [1, 2], "variant": ["ok", "raise"]}
    settings = FAST.replace(strategy="exhaustive", trials=10, restrict=restrict)
    job = Job.of("jt_faulty", Problem.of({"M": 40}, dtype="float32", world_size=2), settings)
    restarts = compiler.restarts
    tune(sqlite_url, job, compiler=compiler)
    result = result_of(sqlite_url, job)
    kinds = {canonical_json(trial_config(t)): (trial_kind(t), t.user_attrs.get(ATTR_REASON)) for t in result.trials}
    raised = canonical_json({"mode": "fast", "tile": 1, "variant": "raise"})
    assert kinds.pop(raised) == ("failed", "compile")  # told as a compile failure, with the worker's words
    failed = next(t for t in result.trials if canonical_json(trial_config(t)) == raised)
    assert "KernelError: out of resources" in failed.user_attrs[ATTR_DETAIL]
    # every other config ran: the one whose worker died too (compiled in the rank instead), and the study ended
    assert set(kinds.values()) == {("ok", None)} and len(kinds) == 3
    assert (where / "crashed").exists() and compiler.restarts == restarts + 1
    assert result.done_reason == "exhausted"
