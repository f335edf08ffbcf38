"""Non-deterministic modes (gemm_rs's atomic): offered by tuners and used by the decorator only where allowed.

The setting (`allow_nondeterministic`, off by default) reaches the tuner through TuneSettings, the CLI's
`--allow-nondeterministic` and sweep files; a study that allows them is a study of its own. The decorator
treats a record of such a mode as a miss of its source unless `joint_autotune(..., allow_nondeterministic=True)`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jt_families
import optuna
import pytest
import torch

from jointtune.autotune.runtime.decorator import NoConfigError, joint_autotune
from jointtune.autotune.runtime.lookup import LookupWarning, reset_warnings
from jointtune.autotune.tuner.handles import study_space
from jointtune.autotune.tuner.keys import triton_version
from jointtune.autotune.tuner.results import study_name_for
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.workers.sweeps.sweepfile import SweepFileError, parse_sweep
from jointtune.cli import main
from jointtune.db import NewRecord, RecordKey, open_store
from jointtune.errors import TuningError, UnknownNameError
from jointtune.hardware import current_limits, detect
from jointtune.kernels import get_family
from jointtune.kernels.gemm_rs import gemm_rs, reference
from jointtune.kernels.runtime.family import register_family
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import Space, categorical, get_space, register_space

JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]
GEMM_RS = get_family("gemm_rs")
SHAPE = {"M": 32, "N": 32, "K": 64}
SHAPE_TEXT = "32x32x64"
W = 2


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOINTTUNE_MODE", "JOINTTUNE_SERVER", "JOINTTUNE_PRINT", "JOINTTUNE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    reset_warnings()


def _job(**settings: Any) -> Job:
    return Job("gemm_rs", tuple(sorted(SHAPE.items())), "bfloat16", W, TuneSettings(**settings))


# ---- settings -----------------------------------------------------------------------------------
def test_settings_default_off_validate_as_a_bool_and_round_trip() -> None:
    assert TuneSettings().allow_nondeterministic is False
    allowed = TuneSettings(allow_nondeterministic=True, restrict={"mode": "atomic"})
    back = TuneSettings.from_json(json.loads(json.dumps(allowed.to_json())))
    assert back == allowed and back.allow_nondeterministic is True and back.to_json()["allow_nondeterministic"]
    # settings stored before the field existed read back as "not allowed"
    old = {k: v for k, v in TuneSettings().to_json().items() if k != "allow_nondeterministic"}
    assert TuneSettings.from_json(old).allow_nondeterministic is False
    for bad in ("yes", 1, None):
        with pytest.raises(TuningError, match=rf"allow_nondeterministic: {bad!r} is not allowed; it must be true"):
            TuneSettings(allow_nondeterministic=bad)


# ---- the studied space --------------------------------------------------------------------------
def test_study_space_leaves_atomic_out_by_default_and_keeps_it_when_allowed() -> None:
    full = get_space("gemm_rs")
    assert "atomic" in full.modes and full.nondeterministic == ("atomic",)
    off = study_space(GEMM_RS, TuneSettings())
    on = study_space(GEMM_RS, TuneSettings(allow_nondeterministic=True))
    assert off.modes == tuple(m for m in full.modes if m != "atomic") and "baseline" in off.modes
    assert off.nondeterministic == ()
    assert on.modes == full.modes and on.version == full.version and on.nondeterministic == ("atomic",)
    problem = full.make_problem(SHAPE, dtype="bf16", world_size=W)
    limits = current_limits()
    atomic = full.count(problem, limits, where={"mode": "atomic"})
    assert atomic > 0 and off.count(problem, limits) == on.count(problem, limits) - atomic
    assert all(c["mode"] != "atomic" for c in off.enumerate(problem, limits))
    # allowed and not allowed are different studies (the narrowed space has its own version)
    assert off.version != on.version
    assert study_name_for(_job(), "hw") != study_name_for(_job(allow_nondeterministic=True), "hw")
    # a restriction to deterministic modes is the same sub-space (and study) either way
    pull = study_space(GEMM_RS, TuneSettings(restrict={"mode": "pull"}))
    assert pull.modes == ("pull", "baseline")
    also_atomic = TuneSettings(restrict={"mode": "pull"}, allow_nondeterministic=True)
    assert pull.version == study_space(GEMM_RS, also_atomic).version
    # families without non-deterministic modes are untouched
    ag = get_family("ag_gemm")
    assert study_space(ag, TuneSettings()).version == get_space("ag_gemm").version


def test_restricting_to_atomic_without_permission_names_the_field_and_the_way_to_allow_it() -> None:
    for restrict in ({"mode": "atomic"}, {"mode": ["pull", "atomic"]}):
        with pytest.raises(TuningError) as exc:
            study_space(GEMM_RS, TuneSettings(restrict=restrict))
        message = str(exc.value)
        assert message.startswith("restrict.mode: 'atomic' is not allowed without allow_nondeterministic")
        assert "--allow-nondeterministic" in message and "allow_nondeterministic: true" in message
    space = study_space(GEMM_RS, TuneSettings(restrict={"mode": "atomic"}, allow_nondeterministic=True))
    assert space.modes == ("atomic", "baseline") and space.nondeterministic == ("atomic",)


# ---- sweep files --------------------------------------------------------------------------------
def _sweep(top: Mapping[str, Any] | None = None, profile: Mapping[str, Any] | None = None, **job: Any) -> dict:
    entry = {"kernel": "gemm_rs", "shapes": [SHAPE_TEXT], "dtypes": ["bf16"], "world_size": W, **job}
    return {"tuning": dict(top or {}), "profiles": {"cpu": {"tuning": dict(profile or {}), "jobs": [entry]}}}


def test_sweep_files_take_allow_nondeterministic_at_every_level() -> None:
    (job,) = parse_sweep(_sweep()).jobs("cpu")
    assert job.settings.allow_nondeterministic is False
    for data in (
        _sweep(top={"allow_nondeterministic": True}),
        _sweep(profile={"allow_nondeterministic": True}),
        _sweep(allow_nondeterministic=True),
        _sweep(top={"allow_nondeterministic": True}, restrict={"mode": "atomic"}),
    ):
        (job,) = parse_sweep(data).jobs("cpu")
        assert job.settings.allow_nondeterministic is True
        assert study_name_for(job, "hw").endswith(study_space(GEMM_RS, job.settings).version)
    # a job's value overrides its profile's, which overrides the file's
    (job,) = parse_sweep(_sweep(top={"allow_nondeterministic": True}, allow_nondeterministic=False)).jobs("cpu")
    assert job.settings.allow_nondeterministic is False
    with pytest.raises(SweepFileError, match=r"profiles\.cpu\.jobs\[0\]\.allow_nondeterministic: Input should be"):
        parse_sweep(_sweep(allow_nondeterministic="maybe"))
    with pytest.raises(SweepFileError, match=r"profiles\.cpu\.jobs\[0\]: restrict\.mode: 'atomic' is not allowed"):
        parse_sweep(_sweep(restrict={"mode": ["atomic"]}))


# ---- the CLI ------------------------------------------------------------------------------------
def test_cli_refuses_atomic_without_the_flag_and_passes_the_flag_on(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", "--kernel", "gemm_rs", "--shape", SHAPE_TEXT, "--world-size", str(W), "--strategy", "exhaustive"]
    with pytest.raises(SystemExit) as done:
        main([*args, "--trials", "1", "--restrict", "mode=atomic"])
    assert done.value.code == 2
    assert "error: restrict.mode: 'atomic' is not allowed" in capsys.readouterr().err
    # with the flag the atomic sub-space is accepted; an exhaustive budget too small for it stops before any work,
    # and the count it names is that of the space with atomic in it
    allowed = study_space(GEMM_RS, TuneSettings(restrict={"mode": "atomic"}, allow_nondeterministic=True))
    from jointtune.search_spaces import DeviceLimits

    problem = allowed.make_problem(SHAPE_TEXT, dtype="bf16", world_size=W)
    count = allowed.count(problem, DeviceLimits.nominal_hopper())
    with pytest.raises(SystemExit) as done:
        main([*args, "--trials", "1", "--restrict", "mode=atomic", "--allow-nondeterministic"])
    assert done.value.code == 2
    assert f"which has {count:,} valid configs" in capsys.readouterr().err


ONE_ATOMIC = {"mode": "atomic", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
              "num_stages": 2, "SPLIT_K": 1, "chunk_m": 16, "reduce_sms": 1, "tile_order": "peers_first"}  # fmt: skip


def test_cli_tunes_atomic_end_to_end_with_the_flag(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    args = ["tune", "--kernel", "gemm_rs", "--shape", SHAPE_TEXT, "--world-size", str(W), "--strategy", "exhaustive"]
    args += ["--trials", "3", "--warmup", "0", "--iters", "1", "--db", url, "--allow-nondeterministic"]
    for name, value in ONE_ATOMIC.items():
        args += ["--restrict", f"{name}={value}"]
    done = subprocess.run([*JOINTTUNE, *args], env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = optuna.get_all_study_summaries(url)
    settings = TuneSettings(restrict=ONE_ATOMIC, allow_nondeterministic=True)
    assert summary.study_name.split(":s")[-1].startswith(study_space(GEMM_RS, settings).version)
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    done_configs = [json.loads(t.user_attrs["jt_config"]) for t in study.trials if t.state.is_finished()]
    assert {c["mode"] for c in done_configs} == {"atomic", "baseline"}


# ---- the decorator ------------------------------------------------------------------------------
def _record(config: Mapping[str, Any], shape: Mapping[str, int] = SHAPE, latency_us: float = 10.0) -> NewRecord:
    return NewRecord(
        kernel="gemm_rs",
        kernel_version=GEMM_RS.version,
        space_version=get_space("gemm_rs").version,
        shape=dict(shape),
        dtype="bfloat16",
        world_size=W,
        hardware_id=detect().hardware_id,
        triton_version=triton_version(),
        config=dict(config),
        latency_p50_us=latency_us,
        trials=4,
        timing="eager",
    )


def _valid(mode: str) -> dict[str, Any]:
    """The first valid config of `mode` at SHAPE (the space decides; no knob values copied here)."""
    space = get_space("gemm_rs")
    problem = space.make_problem(SHAPE, dtype="bf16", world_size=W)
    return next(space.enumerate(problem, current_limits(), where={"mode": mode}))


def _launcher(db_url: str, **options: Any) -> Any:
    """gemm_rs on simulated ranks behind the decorator; records each config it ran."""
    seen: list[dict[str, Any]] = []

    @joint_autotune(
        space="gemm_rs",
        key=lambda a, b, *, world: {"M": a[0].shape[0], "N": b[0].shape[1], "K": a[0].shape[1] * world.world_size},
        db_url=db_url,
        timing="eager",  # no graph warm-up: what a call runs is what the test sees
        **options,
    )
    def launch(a: list[torch.Tensor], b: list[torch.Tensor], *, world: LocalWorld, config: Any) -> Any:
        seen.append(dict(config))
        return gemm_rs(a, b, world=world, config=config)

    launch.seen = seen  # type: ignore[attr-defined]
    return launch


def _call(launch: Any, world: LocalWorld) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    k_r = SHAPE["K"] // W
    a = [torch.randn(SHAPE["M"], k_r, generator=gen).to(torch.bfloat16) for _ in range(W)]
    b = [torch.randn(k_r, SHAPE["N"], generator=gen).to(torch.bfloat16) for _ in range(W)]
    out = launch(a, b, world=world)
    for o, r in zip(out, reference(a, b)):
        assert float((o.float() - r).norm() / r.norm()) < 2e-2
    return launch.seen[-1]


def _source(launch: Any) -> str:
    (source,) = launch.sources.values()
    return source


@pytest.fixture
def world() -> LocalWorld:
    return LocalWorld(world_size=W)


def _warned(fn: Any) -> tuple[Any, list[str]]:
    """`fn()` and the LookupWarnings it raised (the decorator warns once per cause and process)."""
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, LookupWarning)]


def test_an_atomic_record_is_a_miss_without_permission_and_used_with_it(sqlite_url: str, world: LocalWorld) -> None:
    atomic = _valid("atomic")
    open_store(sqlite_url).upsert_record(_record(atomic))
    plain = _launcher(sqlite_url)
    ran, messages = _warned(lambda: _call(plain, world))
    space = get_space("gemm_rs")
    problem = space.make_problem(SHAPE, dtype="bf16", world_size=W)
    assert ran == space.default(problem, current_limits()) and ran["mode"] != "atomic"
    assert _source(plain) == "default" and plain.seen == [ran]  # the atomic config never ran
    assert any("the store config" in m and "mode: 'atomic' is non-deterministic" in m for m in messages)
    assert any("using the space default" in m for m in messages)  # nothing else near
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cache hit runs the cached config: no lookup, no new warning
        assert _call(plain, world) == ran

    allowed = _launcher(sqlite_url, allow_nondeterministic=True)
    ran, messages = _warned(lambda: _call(allowed, world))
    assert ran == atomic and _source(allowed) == "store" and messages == []


def test_a_refused_atomic_record_falls_through_to_the_next_source(sqlite_url: str, world: LocalWorld) -> None:
    store = open_store(sqlite_url)
    store.upsert_record(_record(_valid("atomic")))
    pull = _valid("pull")
    store.upsert_record(_record(pull, shape={**SHAPE, "M": 64}))  # a deterministic record of a nearby shape
    launch = _launcher(sqlite_url)
    ran, messages = _warned(lambda: _call(launch, world))
    assert ran == pull and _source(launch) == "nearest-store"
    assert any("non-deterministic" in m for m in messages)
    strict = _launcher(sqlite_url, on_miss="error")  # only the refused exact record: a miss
    with pytest.raises(NoConfigError, match="no tuned config"):
        _warned(lambda: _call(strict, world))
    assert strict.seen == []


def test_decorator_options_are_checked() -> None:
    with pytest.raises(TuningError, match="allow_nondeterministic: 'yes' is not allowed"):
        _launcher("sqlite://", allow_nondeterministic="yes")
    with pytest.raises(TuningError, match=r"tune_settings\.allow_nondeterministic: True is not allowed"):
        _launcher("sqlite://", tune_settings=TuneSettings(allow_nondeterministic=True))
    with pytest.raises(TuningError, match="allow_nondeterministic: only allowed with space="):
        joint_autotune(configs=[], key=[], allow_nondeterministic=True)(lambda: None)
    # the unknown space is what is wrong, not the key it has no family for
    for space in ("nope", "", "GEMM_RS"):
        with pytest.raises(UnknownNameError, match=f"space: {space!r} is not a known search space; known: "):
            joint_autotune(space=space)(lambda: None)
    with pytest.raises(TuningError, match=r"fn: 'plain' is not a @triton\.jit kernel; .* or give space="):

        def plain(x):
            return x

        joint_autotune(key=["M"])(plain)


# ---- online tuning: a cheap family whose fastest mode is non-deterministic ----------------------
register_space(
    Space(
        "jt_racy",
        dims=("M",),
        params=[categorical("mode", ("baseline", "exact", "racy"))],
        revision=1,
        default=lambda ctx: {"mode": "exact"},
        nondeterministic=("racy",),
    ),
    replace=True,
)
#: simulated latencies (ms): racy is the fastest, so a tuner that may pick it does
RACY_MS = {"baseline": 3.0, "exact": 2.0, "racy": 1.0}


class RacyFamily(jt_families._Doubling):
    name = "jt_racy"
    space = "jt_racy"

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        jt_families.CLOCK.simulate(RACY_MS[config["mode"]] * inputs["scale"] / 1e3)
        return [x * 2 for x in inputs["xs"]]


register_family(RacyFamily())
TINY = TuneSettings(strategy="exhaustive", trials=3, warmup=0, iters=2, warm_start=0, lookahead=0)


@pytest.mark.parametrize("allow", [False, True])
def test_online_tuning_searches_nondeterministic_modes_only_when_allowed(sqlite_url: str, allow: bool) -> None:
    ran: list[dict[str, Any]] = []

    @joint_autotune(space="jt_racy", key=lambda x, *, world: {"M": x.shape[0]}, db_url=sqlite_url, on_miss="tune",
                    tune_settings=TINY, timing="eager", allow_nondeterministic=allow)  # fmt: skip
    def launch(x: torch.Tensor, *, world: Any, config: Any) -> torch.Tensor:
        ran.append(dict(config))
        return x * 2

    launch(torch.ones(32), world=LocalWorld(world_size=W))
    assert ran == [{"mode": "racy" if allow else "exact"}]
    assert next(iter(launch.sources.values())) == "tune"
    (record,) = open_store(sqlite_url).list_records(RecordKey.any(kernel="jt_racy"))
    study = optuna.load_study(study_name=record.study_name, storage=sqlite_url)
    measured = {json.loads(t.user_attrs["jt_config"])["mode"] for t in study.trials if t.state.is_finished()}
    assert measured == ({"baseline", "exact", "racy"} if allow else {"baseline", "exact"})
