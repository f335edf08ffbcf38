"""Tuning a sub-space (`restrict`): settings round-trip, the baseline stays, studies never mix."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest

from jointtune.autotune.tuner.handles import study_space
from jointtune.autotune.tuner.results import study_name_for
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import trial_kind
from jointtune.autotune.workers.sweeps.sweepfile import parse_sweep
from jointtune.cli.tune import parse_restrictions
from jointtune.errors import TuningError
from jointtune.kernels import get_family
from jointtune.search_spaces import Problem, canonical_json

JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]


def test_settings_carry_the_restriction_through_json_and_compare_by_value() -> None:
    a = TuneSettings(restrict={"splits": [2, 4], "mode": "split"})
    b = TuneSettings.from_json(json.loads(json.dumps(a.to_json())))
    assert a == b and hash(a) == hash(b)
    assert a.to_json()["restrict"] == {"mode": ["split"], "splits": [2, 4]}
    with pytest.raises(TuningError, match="restrict: 3 is not allowed"):
        TuneSettings(restrict=3)


def test_cli_restrictions_parse_typed_values() -> None:
    assert parse_restrictions(["BLOCK_K=64,128", "mode=ce", "flag=true"]) == {
        "BLOCK_K": [64, 128],
        "mode": ["ce"],
        "flag": [True],
    }
    with pytest.raises(TuningError, match="--restrict: 'BLOCK_K' is not allowed; write NAME=VALUE"):
        parse_restrictions(["BLOCK_K"])


def test_a_restricted_job_keeps_the_baseline_and_gets_its_own_study(families) -> None:
    full = Job("jt_matmul", (("K", 32), ("M", 64), ("N", 48)), "float32", 2)
    sub = Job("jt_matmul", full.shape, "float32", 2, TuneSettings(restrict={"mode": "split", "splits": [2, 8]}))
    space = study_space(get_family("jt_matmul"), sub.settings)
    assert space.param("mode").choices == ("baseline", "split") and space.param("splits").choices == (2, 8)
    assert study_name_for(sub, "hw") != study_name_for(full, "hw")


def test_an_exhaustive_study_of_a_sub_space_measures_exactly_its_configs(families, tmp_path, subprocess_env) -> None:
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    args = ["tune", "--kernel", "jt_matmul", "--shape", "64x48x32", "--dtype", "fp32", "--world-size", "2"]
    args += ["--trials", "20", "--warmup", "0", "--iters", "1", "--db", url, "--strategy", "exhaustive"]
    args += ["--restrict", "splits=2,8", "--restrict", "order=km", "--import", "jt_families"]
    done = subprocess.run([*JOINTTUNE, *args], env=subprocess_env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = optuna.get_all_study_summaries(url)
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    configs = {t.user_attrs["jt_config"] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert configs == {
        '{"mode":"baseline"}',
        '{"mode":"split","order":"km","splits":2}',
        '{"mode":"split","order":"km","splits":8}',
    }


def test_sweep_files_validate_the_restriction(families) -> None:
    def sweep(restrict: dict) -> dict:
        job = {"kernel": "jt_matmul", "shapes": ["64x48x32"], "dtypes": ["fp32"], "restrict": restrict}
        return {"profiles": {"cpu": {"jobs": [job]}}}

    (job,) = parse_sweep(sweep({"splits": [4]})).jobs("cpu")
    assert job.settings.restrict == (("splits", (4,)),)
    with pytest.raises(TuningError, match=r"restrict\.splits: 3 is not allowed; allowed: 1, 2, 4, 8"):
        parse_sweep(sweep({"splits": [3]}))


def test_an_exhaustive_study_larger_than_its_budget_is_refused_up_front(families, capsys) -> None:
    from jointtune.cli import main

    args = ["tune", "--kernel", "jt_matmul", "--shape", "64x48x32", "--dtype", "fp32", "--strategy", "exhaustive"]
    with pytest.raises(SystemExit) as done:
        main([*args, "--trials", "5"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "trials: 5 is not allowed for an exhaustive study of jt_matmul at M=64,N=48,K=32" in err
    assert "which has 9 valid configs; allowed: >= 9" in err


def test_a_sub_space_without_the_family_default_gets_no_stand_in_but_its_mode_is_covered(families) -> None:
    from jointtune.autotune.tuner.search import initial_configs
    from jointtune.search_spaces import DeviceLimits, get_space

    full = get_space("jt_matmul")
    problem = full.make_problem("64x48x32", dtype="fp32", world_size=2)
    limits = DeviceLimits.nominal_hopper()
    inside = full.restrict({"splits": [2, 4]})  # the family default (splits=2, order=mk) lies inside
    outside = full.restrict({"splits": [4, 8]})
    assert [s.role for s in initial_configs(inside, problem, limits)] == ["baseline", "default"]
    # the start covers mode=split all the same: with its valid config nearest to the default (splits=4, order=mk)
    start = initial_configs(outside, problem, limits)
    assert [(s.role, s.config) for s in start] == [
        ("baseline", {"mode": "baseline"}),
        ("mode", {"mode": "split", "splits": 4, "order": "mk"}),
    ]


@pytest.mark.parametrize(
    ("restrict", "trials", "configs"),
    [
        (["mode=baseline", "collective=nccl"], 3, [{"mode": "baseline", "collective": "nccl"}]),
        (
            ["mode=ce", "ce_consumer=cublas", "ce_chunks=1,2"],
            6,  # the baseline in each of its 3 collective variants, and the 2 ce configs
            [{"mode": "baseline", "collective": c} for c in ("nccl", "nccl_symm", "nccl_ce")]
            + [{"mode": "ce", "ce_consumer": "cublas", "ce_chunks": c} for c in (1, 2)],
        ),
    ],
    ids=["one-config", "three-configs"],
)
def test_a_sub_space_smaller_than_the_budget_measures_each_of_its_configs(
    tmp_path, subprocess_env, restrict, trials, configs
) -> None:
    """The trial claimed ahead (lookahead 1, the default) finds nothing new: that must not stop the study
    and drop the claimed trial before it ran (0 of 3 measured and exit 1, or 2 of 3 configs)."""
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    args = ["tune", "--kernel", "ag_gemm", "--shape", "64x64x64", "--trials", str(trials), "--db", url]
    args += ["--warmup", "0", "--iters", "1", *(a for r in restrict for a in ("--restrict", r))]
    done = subprocess.run([*JOINTTUNE, *args], env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = optuna.get_all_study_summaries(url)
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    measured = [t.user_attrs["jt_config"] for t in study.trials if trial_kind(t) in ("ok", "failed")]
    assert sorted(measured) == sorted(canonical_json(c) for c in configs)
    assert {trial_kind(t) for t in study.trials if trial_kind(t) in ("ok", "failed")} == {"ok"}
    assert not [t for t in study.trials if trial_kind(t) == "interrupted"]  # claimed, then given back unrun
    assert study.user_attrs["jt_stopped"] == "exhausted"


@pytest.mark.parametrize("strategy", ["tpe", "exhaustive"])
def test_a_restriction_that_leaves_only_the_baseline_is_refused_before_any_rank_starts(
    tmp_path, capsys, strategy
) -> None:
    from jointtune.cli import main

    db = tmp_path / "jt.db"
    args = ["tune", "--kernel", "ag_gemm", "--shape", "64x64x64", "--trials", "3", "--db", f"sqlite:///{db}"]
    args += ["--strategy", strategy, "--restrict", "mode=push", "--restrict", "SPLIT_K=4", "--restrict", "BLOCK_K=256"]
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: restrict: BLOCK_K=256 SPLIT_K=4 mode=push leaves ag_gemm ")
    assert "no valid config but the baseline" in err and "at M=64,N=64,K=64, bfloat16, world size 2" in err
    assert not db.exists()  # refused before the store, a study or a rank


def test_sweep_files_refuse_a_restriction_that_leaves_only_the_baseline(families) -> None:
    def sweep(restrict: dict) -> dict:
        job = {"kernel": "jt_sleep", "shapes": ["64"], "dtypes": ["fp32"], "restrict": restrict}
        return {"profiles": {"cpu": {"jobs": [job]}}}

    with pytest.raises(TuningError, match=r"shapes\[0\] .*restrict: chunk=4 tile=16 leaves jt_sleep no valid config"):
        parse_sweep(sweep({"tile": 16, "chunk": 4}))  # tile*chunk <= 16: no fast config, the baseline alone
    (job,) = parse_sweep(sweep({"mode": "baseline"})).jobs("cpu")  # the baseline asked for: a study of it
    assert job.settings.restrict == (("mode", ("baseline",)),)


def test_the_restriction_check_refuses_only_a_restriction_that_leaves_nothing_asked_for(families) -> None:
    from jointtune.autotune.tuner.search import check_study

    family = get_family("jt_sleep")
    problem = Problem.of({"M": 64}, dtype="float32", world_size=2)

    def check(**restrict) -> None:
        settings = TuneSettings(restrict=restrict)
        check_study(study_space(family, settings), problem, settings)

    check(mode="baseline")  # the baseline asked for: a study of it alone
    check(tile=16, chunk=1)
    check(mode=["baseline", "fast"], tile=16, chunk=4)
    for restrict in ({"mode": "fast", "tile": 16, "chunk": 4}, {"tile": 16, "chunk": 4}):  # tile*chunk <= 16
        with pytest.raises(TuningError, match=r"leaves jt_sleep no valid config but the baseline .* at M=64, float32"):
            check(**restrict)
