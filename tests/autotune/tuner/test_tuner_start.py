"""A study's start covers every mode its problem allows, at any world size (issue 34: a 16-trial tune that never
tried the copy engine found a sixth of the gain a 48-trial one found), in a fixed order."""

from __future__ import annotations

import pytest

from jointtune.autotune.tuner.handles import study_space
from jointtune.autotune.tuner.search import initial_configs
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.kernels import get_family
from jointtune.search_spaces import DeviceLimits

#: shapes every world size of 2, 3 and 4 divides, at a decode size and a prefill size
SHAPES = {
    "ag_gemm": ("96x3072x4096", "1536x6144x4096"),
    "gemm_rs": ("96x4096x3072", "1536x4096x6144"),
    "flash_decode": ("1x40x8x65536x128", "8x32x8x12288x128"),
}
CASES = [(kernel, shape, w) for kernel, shapes in SHAPES.items() for shape in shapes for w in (2, 3, 4)]


@pytest.mark.parametrize("interpreter", [False, True], ids=["gpu-limits", "interpreter"])
@pytest.mark.parametrize(("kernel", "shape", "world_size"), CASES, ids=[f"{k}-{s}-w{w}" for k, s, w in CASES])
def test_the_first_trials_cover_every_mode_the_problem_allows(kernel, shape, world_size, interpreter):
    settings = TuneSettings()
    space = study_space(get_family(kernel), settings)  # gemm_rs's atomic mode is left out unless allowed
    problem = space.make_problem(shape, dtype="bf16", world_size=world_size)
    limits = DeviceLimits.nominal_hopper(interpreter=interpreter)
    start = initial_configs(space, problem, limits)
    allowed = [m for m in space.modes if space.count(problem, limits, where={"mode": m})]
    assert {s.config["mode"] for s in start} == set(allowed) and len(allowed) >= 4
    assert start[0].role == "baseline" and len(start) <= 12  # all of it long before a 24-trial budget ends
    assert all(not space.violations(s.config, problem, limits) for s in start)
    assert initial_configs(space, problem, limits) == start  # the same start on every run


def test_gemm_rs_covers_its_atomic_mode_where_it_is_allowed():
    settings = TuneSettings(allow_nondeterministic=True)
    space = study_space(get_family("gemm_rs"), settings)
    problem = space.make_problem("1536x4096x6144", dtype="bf16", world_size=3)
    modes = [s.config["mode"] for s in initial_configs(space, problem, DeviceLimits.nominal_hopper())]
    assert "atomic" in modes and set(modes) == set(space.modes)


@pytest.mark.parametrize("world_size", [3, 4])
def test_a_tune_runs_every_mode_in_its_first_trials(families, sqlite_url, world_size):
    from jt_tuning import result_of, tune

    from jointtune.autotune.tuner.studies import trial_config

    space = get_family("jt_sim_decode")
    problem = study_space(space, TuneSettings()).make_problem("8x32x8x12288x128", dtype="bf16", world_size=world_size)
    job = Job.of("jt_sim_decode", problem, TuneSettings(trials=6, warmup=0, iters=1, seed=0))
    tune(sqlite_url, job)
    result = result_of(sqlite_url, job)
    first = [trial_config(t)["mode"] for t in sorted(result.state.counted, key=lambda t: t.number)[:4]]
    assert sorted(first) == sorted(("fused", "pull", "wait", "baseline"))
    assert result.done_reason == "trials" and result.state.refused_count == 0
