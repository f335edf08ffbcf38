"""Sampling inside the valid space (issue 34): the nearest valid config, the config at an index, the space's
sampler and one start per mode, for every family at world sizes 2, 3 and 4."""

from __future__ import annotations

import random
import warnings

import optuna
import pytest

from jointtune.errors import SpaceError
from jointtune.search_spaces import DeviceLimits, get_space

HOPPER = DeviceLimits.nominal_hopper(interpreter=False)
SHAPES = {"ag_gemm": "96x3072x4096", "gemm_rs": "1536x4096x6144", "flash_decode": "8x40x8x12288x128"}


def _problem(name: str, world_size: int):
    space = get_space(name)
    return space, space.make_problem(SHAPES[name], dtype="bf16", world_size=world_size)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_neighbours_are_valid_distinct_and_one_knob_away(name: str, world_size: int) -> None:
    """`Space.neighbours`: where the tuner looks once TPE repeats itself. Every one is valid and new; each differs
    in the knob it moved, plus only what the rules (or another mode's own knobs) make move; the order is fixed."""
    space, problem = _problem(name, world_size)
    for config in (space.default(problem, HOPPER), *space.mode_starts(problem, HOPPER)):
        found = list(space.neighbours(config, problem, HOPPER))
        assert found == list(space.neighbours(config, problem, HOPPER))
        keys = [space.canonical_json(c) for c in found]
        assert len(keys) == len(set(keys)) and space.canonical_json(config) not in keys
        for near in found:
            assert not space.violations(near, problem, HOPPER)
            moved = {k for k in {*near, *config} if near.get(k) != config.get(k)}
            assert moved
            if near["mode"] == config["mode"] and not moved & set(space.structural):
                # one knob moved, and the rest only as the rules tie them (a tile and its stages, say); a sub-mode
                # (`ce_consumer`, ...) brings its own knobs
                assert len(moved) <= 3, (config, near)
    # an ordered knob's other values come nearest first: kv_split of Flash-Decode's default
    space, problem = _problem("flash_decode", world_size)
    config = space.default(problem, HOPPER)
    splits = [n["kv_split"] for n in space.neighbours(config, problem, HOPPER)
              if {k for k in n if n[k] != config.get(k)} == {"kv_split"}]  # fmt: skip
    at = space.param("kv_split").choices.index(config["kv_split"])
    distance = [abs(space.param("kv_split").choices.index(v) - at) for v in splits]
    assert splits and distance == sorted(distance)


def test_the_nearest_valid_config_keeps_the_mode_and_moves_the_fewest_steps() -> None:
    space, problem = _problem("flash_decode", 2)  # G = 5: heads_per_program must be 1 or 5
    wanted = {**space.default(problem, HOPPER), "mode": "wait", "heads_per_program": 4, "push_programs": 8}
    wanted["items_per_flag"] = 2
    near = space.nearest_valid(wanted, problem, HOPPER)
    assert near["mode"] == "wait" and near["heads_per_program"] == 5 and not space.violations(near, problem, HOPPER)
    assert {k for k in near if near[k] != wanted.get(k)} == {"heads_per_program"}
    # a valid config is its own nearest; pinned values are kept; a pin nothing valid has answers None
    assert space.nearest_valid(near, problem, HOPPER) == near
    pinned = space.nearest_valid(wanted, problem, HOPPER, pinned={"BLOCK_N": 16})
    assert pinned["BLOCK_N"] == 16 and pinned["mode"] == "wait" and not space.violations(pinned, problem, HOPPER)
    assert space.nearest_valid(wanted, problem, HOPPER, pinned={"heads_per_program": 3}) is None
    with pytest.raises(SpaceError, match="mode: 'warp' is not allowed"):
        space.nearest_valid(wanted, problem, HOPPER, pinned={"mode": "warp"})
    # ties are broken by the seed, the same way every time
    nothing = [space.nearest_valid({"mode": "fused"}, problem, HOPPER, seed=s) for s in (1, 2, 1)]
    assert nothing[0] == nothing[2] and all(c["mode"] == "fused" for c in nothing)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_config_at_an_index_is_the_enumerations(name: str) -> None:
    space = get_space(name)
    problem = space.make_problem({"ag_gemm": "64x256x128", "gemm_rs": "64x256x128"}.get(name, "2x8x8x256x64"),
                                 dtype="bf16", world_size=2)  # fmt: skip
    every = list(space.enumerate(problem, HOPPER))
    assert len(every) == space.count(problem, HOPPER) > 100
    for index in [0, len(every) - 1, *random.Random(0).sample(range(len(every)), 100)]:
        assert space.config_at(index, problem, HOPPER) == every[index]
    assert space.config_at(len(every), problem, HOPPER) is None
    mode = space.modes[0]
    some = list(space.enumerate(problem, HOPPER, where={"mode": mode}))
    assert [space.config_at(i, problem, HOPPER, where={"mode": mode}) for i in range(len(some))] == some


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, seed=seed,
                                          n_startup_trials=6)  # fmt: skip


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_space_s_sampler_proposes_only_configs_the_space_takes(name: str, world_size: int) -> None:
    space, problem = _problem(name, world_size)
    for base in (_tpe(world_size), optuna.samplers.RandomSampler(seed=world_size)):
        sampler = space.sampler(base, problem, HOPPER, seed=world_size)
        study = optuna.create_study(sampler=sampler)
        modes = set()
        for i in range(20):
            trial = study.ask()
            config = space.suggest(trial, problem, HOPPER)
            assert space.violations(config, problem, HOPPER) == [], config
            assert trial.params == config  # what the trial holds is what runs
            modes.add(config["mode"])
            study.tell(trial, float(len(str(config)) + i % 3))
        assert len(modes) >= 3  # the sampler still explores the modes
        assert all(set(m) == {"redrawn", "fields", "why"} for m in sampler.moved.values())


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_mode_starts_give_one_valid_config_per_mode_the_problem_allows(name: str, world_size: int) -> None:
    space, problem = _problem(name, world_size)
    starts = space.mode_starts(problem, HOPPER)
    allowed = [m for m in space.modes if space.count(problem, HOPPER, where={"mode": m})]
    assert [c["mode"] for c in starts] == allowed
    assert all(space.violations(c, problem, HOPPER) == [] for c in starts)
    # a sub-space that narrows a mode's knobs still gets a start of that mode, inside it
    narrow = space.restrict({"num_stages": [2]})
    assert [c["mode"] for c in narrow.mode_starts(problem, HOPPER)] == allowed
