"""The tuner's strategy against GPU-measured ground truth (issue 4, experiment 2), replayed on the CPU.

`bench/results/ground_truth_*.json` hold every config's latency of a restricted joint space, measured
exhaustively on GPUs (AG+GEMM on 2x H200; every family at W=2 and W=4 on 4x H100 and 4x H200);
replaying the tuner's own search code against them must come within 3% of the exhaustive best in at
most 24 measured trials.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jointtune.autotune.tuner.replay import ReplayTable, replay, trials_to_target

TABLES = sorted((Path(__file__).resolve().parents[3] / "bench" / "results").glob("ground_truth_*.json"))
#: issue 4's tables (AG+GEMM at W=2, 2x H200), where the control below was measured; the later tables (every family
#: at W=2 and W=4, issue 34) check the tuner itself
ISSUE4_TABLES = [p for p in TABLES if p.stem.endswith("_2xH200_2026-11-22")]


def test_ground_truth_tables_are_committed() -> None:
    assert len(TABLES) >= 2 and len(ISSUE4_TABLES) == 5


@pytest.mark.parametrize("path", TABLES, ids=[p.stem.removeprefix("ground_truth_") for p in TABLES])
def test_the_tuner_gets_within_3_percent_in_24_trials(path: Path) -> None:
    """ "tpe-warm" is the tuner: its start (baseline, default, seeds, every mode) then TPE (issue 34's target)."""
    table = ReplayTable.load(path)
    assert table.space.restriction, "a ground-truth table names the sub-space it enumerated"
    target = table.best_us * 1.03
    for seed in (0, 1, 2):
        curve = replay(table, "tpe-warm", trials=24, seed=seed)
        needed = trials_to_target(curve, target)
        assert needed is not None and needed <= 24, f"seed {seed}: best {min(v for v in curve if v)} µs"


@pytest.mark.parametrize("path", ISSUE4_TABLES, ids=[p.stem.removeprefix("ground_truth_") for p in ISSUE4_TABLES])
def test_joint_tpe_from_the_baseline_alone_gets_within_3_percent_in_48_trials(path: Path) -> None:
    """The control, joint TPE with no start but the baseline: on these tables it must make it too, in 2 of 3 seeds
    (on 1024x8192x8192, where one config of 60 is within 3%, it missed in 1 of 20 seeds at 48 trials, both with
    invalid proposals told as pruned and with proposals drawn inside the valid space)."""
    table = ReplayTable.load(path)
    target = table.best_us * 1.03
    needed = [trials_to_target(replay(table, "tpe", trials=48, seed=seed), target) for seed in (0, 1, 2)]
    assert sum(n is not None for n in needed) >= 2, needed
