"""Timing policies on the tuner's side: settings, study identity, and measuring in the interpreter."""

from __future__ import annotations

import pytest
import torch

from jointtune.autotune.keys import TuningKey
from jointtune.autotune.settings import TIMINGS, Job, TuneSettings
from jointtune.autotune.tuner.timing import EAGER_CALLS, measure
from jointtune.errors import TuningError
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.world import create_world
from jointtune.search_spaces import Problem

PROBLEM = Problem.of({"M": 64, "N": 64, "K": 128}, dtype="bf16", world_size=2)


def test_settings_take_one_policy_and_round_trip():
    assert TuneSettings().timing == "gpu"  # what every record measured before policies existed
    for timing in TIMINGS:
        s = TuneSettings(timing=timing)
        assert TuneSettings.from_json(s.to_json()) == s
    with pytest.raises(TuningError, match=r"timing: 'wall' is not allowed; allowed: gpu, eager, graph"):
        TuneSettings(timing="wall")


def test_each_policy_is_a_study_of_its_own_and_gpu_studies_keep_their_names():
    names = {t: TuningKey.of("ag_gemm", "v1", PROBLEM, "hw", t).study_name(space_version="s1") for t in TIMINGS}
    assert len(set(names.values())) == 3
    assert names["gpu"] == TuningKey.of("ag_gemm", "v1", PROBLEM, "hw").study_name(space_version="s1")
    assert names["eager"].endswith(":teager") and ":tgraph" in names["graph"]
    key = TuningKey.of("ag_gemm", "v1", PROBLEM, "hw", "graph")
    assert TuningKey.from_json(key.to_json()) == key
    assert TuningKey.from_json({k: v for k, v in key.to_json().items() if k != "timing"}).timing == "gpu"
    assert Job.of("ag_gemm", PROBLEM, TuneSettings(timing="eager")).label.endswith("(eager)")


def test_tables_tell_the_policies_of_one_shape_apart():
    """A sweep of two policies has a job per policy for one shape: the live rows and the tuned table say which."""
    from rich.console import Console

    from jointtune.autotune.sweeps.progress import progress_table, summary_table
    from jointtune.autotune.tuner.results import JobResult

    results = [JobResult(Job.of("ag_gemm", PROBLEM, TuneSettings(timing=t)), f"study-{t}") for t in ("gpu", "eager")]
    console = Console(width=200, record=True)
    console.print(progress_table(results))
    console.print(summary_table(results))
    text = console.export_text()
    assert "M=64,N=64,K=128 bf16 w2 gpu" in text and "M=64,N=64,K=128 bf16 w2 eager" in text
    assert " timing " in text  # the tuned table's column


def test_eager_timing_in_the_interpreter_times_whole_calls():
    world = create_world("local", world_size=2)
    a = [torch.randn(32, 128).bfloat16() for _ in range(2)]
    b = [torch.randn(128, 32).bfloat16() for _ in range(2)]
    calls = []

    def run():
        calls.append(1)
        return ag_gemm(a, b, world=world, config={"mode": "baseline"})

    samples = measure(run, world, warmup=2, iters=5, timing="eager")
    assert len(samples) == 5 and all(s > 0 for s in samples)
    assert samples.host_us > 0
    assert len(calls) == 2 + 5  # a local call is synchronous: one call per sample, as `gpu` there
    assert EAGER_CALLS > 1  # on a GPU each sample is a block of calls issued back to back


def test_graph_timing_is_refused_where_there_are_no_graphs():
    world = create_world("local", world_size=2)
    with pytest.raises(TuningError, match=r"timing: 'graph' needs CUDA graphs.*use gpu or eager"):
        measure(lambda: None, world, warmup=0, iters=1, timing="graph")
    with pytest.raises(TuningError, match="timing: 'wall' is not allowed"):
        measure(lambda: None, world, warmup=0, iters=1, timing="wall")
