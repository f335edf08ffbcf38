"""`Space.restrict`: a sub-space whose valid configs are exactly the full space's that obey it."""

from __future__ import annotations

import pytest

from jointtune.errors import SpaceError
from jointtune.search_spaces import DeviceLimits, canonical_json, get_space

LIMITS = DeviceLimits.nominal_hopper(interpreter=False)


def _obeys(config: dict, restriction: dict) -> bool:
    return all(config[name] in values for name, values in restriction.items() if name in config)


@pytest.mark.parametrize(
    "restriction",
    [
        {"mode": ["push", "ce"], "BLOCK_M": [64, 128], "BLOCK_K": [64], "num_warps": [8], "chunk_m": [256, 1024]},
        {"mode": ["pull"], "BLOCK_N": [128], "num_stages": [3]},
        {"ce_consumer": ["cublas"], "BLOCK_M": [128], "BLOCK_N": [256], "BLOCK_K": [64]},
    ],
)
def test_restricted_configs_are_the_full_spaces_configs_that_obey_it(restriction: dict) -> None:
    full = get_space("ag_gemm")
    problem = full.make_problem("1024x1024x2048", dtype="bf16", world_size=2)
    sub = full.restrict(restriction)
    expected = {canonical_json(c) for c in full.enumerate(problem, LIMITS) if _obeys(c, restriction)}
    got = [canonical_json(c) for c in sub.enumerate(problem, LIMITS)]
    assert len(got) == len(set(got)) == sub.count(problem, LIMITS)
    assert set(got) == expected and expected
    for config in sub.enumerate(problem, LIMITS):
        assert full.violations(config, problem, LIMITS) == []


def test_a_pinned_mode_drops_the_params_of_the_other_modes_and_gets_its_own_version() -> None:
    full = get_space("ag_gemm")
    sub = full.restrict({"mode": "pull"})
    names = [p.name for p in sub.params]
    assert "comm_sms" not in names and "ce_consumer" not in names and "BLOCK_M" in names
    assert sub.name == full.name and sub.version != full.version
    assert sub.version == full.restrict({"mode": ["pull"]}).version
    assert full.restrict({}) is full


def test_the_default_of_a_restricted_space_lies_inside_it() -> None:
    full = get_space("ag_gemm")
    problem = full.make_problem("8192x4096x12288", dtype="bf16", world_size=2)
    assert full.restrict({"BLOCK_K": [64]}).default(problem, LIMITS) == full.default(problem, LIMITS)
    sub = full.restrict({"mode": "push", "BLOCK_M": [128], "num_warps": [8]})
    default = sub.default(problem, LIMITS)
    assert default["mode"] == "push" and default["BLOCK_M"] == 128 and sub.violations(default, problem, LIMITS) == []
    empty = full.restrict({"mode": "push", "BLOCK_M": [256], "BLOCK_N": [256], "BLOCK_K": [256], "num_stages": [6]})
    with pytest.raises(SpaceError, match="restrict: leaves ag_gemm no valid config"):
        empty.default(problem, LIMITS)


@pytest.mark.parametrize(
    ("restriction", "message"),
    [
        ({"BLOCK_M": [100]}, "restrict.BLOCK_M: 100 is not allowed; allowed: 16, 32, 64, 128, 256"),
        ({"bogus": [1]}, "restrict.bogus: unknown field for space 'ag_gemm'"),
        ({"mode": []}, "restrict.mode: no values given"),
        ({"mode": "pull", "ce_chunks": [4]}, 'restrict.ce_chunks: it only exists when mode == "ce", which the'),
        ({"BLOCK_M": None}, "restrict.BLOCK_M: None is not allowed; give a value or a list of values"),
    ],
)
def test_bad_restrictions_name_the_field(restriction: dict, message: str) -> None:
    with pytest.raises(SpaceError, match=message.replace(".", r"\.")):
        get_space("ag_gemm").restrict(restriction)


@pytest.mark.parametrize(
    ("restriction", "nondeterministic"),
    [
        (
            {"mode": ["atomic", "pull_cublas"], "BLOCK_N": [128, 256], "chunk_m": [64], "reduce_sms": [4, 64]},
            ("atomic",),
        ),
        ({"mode": ["pull", "ce"], "reduce_sms": [8, 128], "BLOCK_K": [64], "num_stages": [3]}, ()),
        ({"tile_order": ["own_first"], "num_warps": [8], "BLOCK_M": [64], "reduce_sms": [32]}, ("atomic",)),
    ],
)
def test_a_restricted_gemm_rs_keeps_its_rules_and_its_nondeterministic_modes(restriction, nondeterministic) -> None:
    # the mode-dependent rule (reduce_sms_budget) still holds inside a restriction, and only the
    # atomic mode, where it is left, stays non-deterministic
    full = get_space("gemm_rs")
    problem = full.make_problem("128x128x256", dtype="bf16", world_size=2)
    sub = full.restrict(restriction)
    assert sub.nondeterministic == nondeterministic and full.nondeterministic == ("atomic",)
    expected = {canonical_json(c) for c in full.enumerate(problem, LIMITS) if _obeys(c, restriction)}
    got = [canonical_json(c) for c in sub.enumerate(problem, LIMITS)]
    assert len(got) == len(set(got)) == sub.count(problem, LIMITS)
    assert set(got) == expected and expected
    atomic = [c for c in sub.enumerate(problem, LIMITS) if c["mode"] == "atomic"]
    assert all(c["reduce_sms"] <= LIMITS.num_sms // 4 for c in atomic)
