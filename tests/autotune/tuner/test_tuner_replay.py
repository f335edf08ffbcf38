"""Replay: strategies compared on a synthetic latency table with a compute x communication interaction."""

from __future__ import annotations

import json
import math

import optuna
import pytest

from jointtune.autotune.tuner.replay import (
    STRATEGIES,
    ReplayTable,
    compare,
    default_comm,
    format_comparison,
    replay,
    trials_to_target,
)
from jointtune.errors import TuningError
from jointtune.search_spaces import (
    Constraint,
    DeviceLimits,
    Space,
    canonical_json,
    categorical,
    choice,
    pow2,
    register_space,
    when,
)

FUSED = when(mode=("pull", "push"))


def _warps(cfg, ctx):
    if cfg["num_warps"] == 4 or cfg["BLOCK_M"] * cfg["BLOCK_N"] >= 4096:
        return None
    return f"num_warps: 8 is not allowed with BLOCK_M*BLOCK_N = {cfg['BLOCK_M'] * cfg['BLOCK_N']}; allowed: 4"


SPACE = register_space(
    Space(
        "jt_replay",
        dims=("M",),
        params=[
            categorical("mode", ("pull", "push", "baseline")),
            pow2("BLOCK_M", 16, 128, when=FUSED),
            pow2("BLOCK_N", 32, 128, when=FUSED),
            choice("num_warps", (4, 8), when=FUSED),
            pow2("chunk_m", 16, 256, when=when(mode="push")),
            pow2("comm_sms", 1, 8, when=when(mode="push")),
        ],
        constraints=[Constraint("warps", ("num_warps", "BLOCK_M", "BLOCK_N"), "8 warps need big tiles", _warps)],
        revision=1,
        default=lambda ctx: {
            "mode": "push",
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "num_warps": 4,
            "chunk_m": 16,
            "comm_sms": 1,
        },
    ),
    replace=True,
)


def synthetic_latency(c: dict) -> float:
    """Push wins when its chunk matches the tile height: tuning tiles at the default chunk misleads."""
    if c["mode"] == "baseline":
        return 400.0
    tile = 10 * abs(math.log2(c["BLOCK_N"]) - 7) + (0 if c["num_warps"] == (8 if c["BLOCK_M"] >= 64 else 4) else 15)
    if c["mode"] == "pull":
        return 300.0 + tile + 20 * abs(math.log2(c["BLOCK_M"]) - 5)
    match = 60 * abs(math.log2(c["chunk_m"]) - math.log2(c["BLOCK_M"]))
    return 100.0 + tile + match + 40 * abs(math.log2(c["BLOCK_M"]) - 7) + 8 * abs(math.log2(c["comm_sms"]) - 2)


@pytest.fixture(scope="module")
def table() -> ReplayTable:
    limits = DeviceLimits.nominal_hopper(interpreter=False)
    problem = SPACE.make_problem({"M": 4096}, dtype="bf16", world_size=2)
    latencies = {canonical_json(c): synthetic_latency(c) for c in SPACE.enumerate(problem, limits)}
    broken = {"mode": "pull", "BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}
    latencies[canonical_json(broken)] = None  # a config that failed on the GPU
    return ReplayTable(SPACE, problem, latencies, limits)


def test_the_table_round_trips_and_knows_its_best(table, tmp_path):
    path = tmp_path / "table.json"
    table.save(path)
    again = ReplayTable.load(path)
    assert again.latencies == table.latencies and again.problem == table.problem
    assert again.best_us == table.best_us == 100.0
    assert table.latency({"mode": "baseline"}) == 400.0
    with pytest.raises(TuningError, match="latencies"):
        ReplayTable.from_json({"space": "jt_replay", "shape": {"M": 8}, "dtype": "bf16", "world_size": 2})


def test_a_replay_is_deterministic_per_seed_and_measures_each_config_once(table):
    for strategy in STRATEGIES:
        curve = replay(table, strategy, trials=24, seed=3)
        assert curve == replay(table, strategy, trials=24, seed=3)
        assert len(curve) == 24
        assert curve[0] == 400.0  # every strategy measures the baseline first
    assert replay(table, "tpe", trials=24, seed=3) != replay(table, "tpe", trials=24, seed=4)
    assert trials_to_target([None, 500.0, 120.0, 101.0], 103.0) == 4
    assert trials_to_target([None, 500.0], 103.0) is None


def test_two_stage_fixes_communication_then_compute(table):
    comm = default_comm(table)
    assert comm == {"mode": "push", "chunk_m": 16, "comm_sms": 1}
    study_configs = []
    original = table.latency

    def spy(config):
        study_configs.append(dict(config))
        return original(config)

    table.latency = spy  # type: ignore[method-assign]
    try:
        replay(table, "two-stage", trials=21, seed=1)
    finally:
        del table.latency
    baseline, stage1, stage2 = study_configs[0], study_configs[1:11], study_configs[11:]
    assert baseline == {"mode": "baseline"}
    assert all({k: c[k] for k in comm} == comm for c in stage1)
    tiles = {c["BLOCK_M"] for c in stage2 if "BLOCK_M" in c}
    assert len(tiles) <= 1  # the best tiles of stage 1, held fixed


def test_compare_reports_trials_to_within_three_percent(table):
    stats = compare(table, ["random", "tpe", "two-stage"], seeds=4, trials=40)
    assert set(stats) == {"random", "tpe", "two-stage"}
    for s in stats.values():
        assert len(s.needed) == 4 and all(n is None or 1 <= n <= 40 for n in s.needed)
        assert all(g >= 0 for g in s.final_gap)
        assert json.loads(json.dumps(s.to_json()))["strategy"] == s.strategy
    # the interaction defeats the two-stage search: tiles tuned at chunk_m=16 pick BLOCK_M=16
    assert stats["two-stage"].success_rate == 0.0
    assert min(stats["two-stage"].final_gap) > 0.03
    text = format_comparison(stats)
    assert text.splitlines()[0].split()[0] == "strategy" and "two-stage" in text


def test_a_table_from_an_exhaustive_study(table):
    study = optuna.create_study()
    recorded = dict(list(table.latencies.items())[:6])
    for key, value in recorded.items():
        study.enqueue_trial(json.loads(key))
        trial = study.ask()
        assert canonical_json(SPACE.suggest(trial, table.problem, table.limits)) == key
        trial.set_user_attr("jt_config", key)
        if value is None:
            trial.set_user_attr("fail_reason", "compile")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
    rebuilt = ReplayTable.from_study(study, SPACE, table.problem, table.limits)
    assert rebuilt.latencies == recorded
