"""The layout rule: per token count, from measurements (no assertion here depends on a real timing)."""

from __future__ import annotations

import pytest

from jointtune import create_world
from jointtune.tp.layout import LayoutRule, LayoutRuleError, measure_layouts


def test_without_measurements_sp_from_a_threshold_and_never_for_uneven_counts():
    rule = LayoutRule(sp_from=512)
    assert [rule.choose(t, 4) for t in (4, 256, 512, 514, 4096)] == ["standard", "standard", "sp", "standard", "sp"]
    assert rule.choose(4096, 1) == "standard"
    assert rule.explain(514, 4) == ("standard", "514 tokens do not divide by 4 ranks")


def test_measurements_drive_the_choice_at_the_nearest_token_count(tmp_path):
    rule = LayoutRule.from_measurements({
        8: {"sp": 50.0, "standard": 40.0},
        256: {"sp": 90.0, "standard": 95.0},
        4096: {"sp": 900.0, "standard": 1200.0},
        9: {"standard": 41.0},  # an uneven count: standard only, no say in the rule
    })  # fmt: skip
    # nearest in log2: 16 is 1 from 8, 64 is 2 from 256 (and 3 from 8)
    assert [rule.choose(t, 2) for t in (2, 8, 16, 64, 128, 1024, 8192)] == [
        "standard", "standard", "standard", "sp", "sp", "sp", "sp"]  # fmt: skip
    layout, why = rule.explain(2048, 2)
    assert layout == "sp" and why.startswith("measured at 4096 tokens")
    path = tmp_path / "rule.json"
    rule.save(path)
    assert LayoutRule.load(path) == rule


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({0: {"sp": 1.0, "standard": 1.0}}, "tokens: 0 is not allowed"),
        ({8: {"fast": 1.0}}, "tokens 8: layout 'fast' is not allowed; allowed: sp, standard"),
        ({8: {"sp": float("nan"), "standard": 1.0}}, "tokens 8: sp: nan is not allowed"),
    ],
)
def test_bad_tables_name_the_entry(table, message):
    with pytest.raises(LayoutRuleError, match=message):
        LayoutRule.from_measurements(table)


def test_measure_layouts_times_both_layouts_where_the_rows_divide():
    world = create_world("local", world_size=2)
    calls = []
    table = measure_layouts(lambda layout, T: calls.append((layout, T)), [3, 8], world, warmup=1, iters=2)
    assert sorted(table) == [3, 8] and sorted(table[3]) == ["standard"] and sorted(table[8]) == ["sp", "standard"]
    assert all(us > 0 for times in table.values() for us in times.values())
    assert calls.count(("sp", 8)) == 3 and calls.count(("standard", 3)) == 3 and ("sp", 3) not in calls
    assert LayoutRule.from_measurements(table).measured[0][0] == 8
