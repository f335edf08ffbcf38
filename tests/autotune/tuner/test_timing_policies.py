"""Timing policies on the tuner's side: settings, study identity, and measuring in the interpreter."""

from __future__ import annotations

import pytest
import torch

from jointtune.autotune.tuner.keys import TuningKey
from jointtune.autotune.tuner.settings import TIMINGS, Job, TuneSettings
from jointtune.autotune.tuner.timing import EAGER_CALLS, measure
from jointtune.errors import TuningError
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.runtime.world import create_world
from jointtune.search_spaces import Problem

PROBLEM = Problem.of({"M": 64, "N": 64, "K": 128}, dtype="bf16", world_size=2)


def test_settings_take_one_policy_and_round_trip():
    assert TuneSettings().timing == "gpu"  # what every record measured before policies existed
    for timing in TIMINGS:
        s = TuneSettings(timing=timing)
        assert TuneSettings.from_json(s.to_json()) == s
    with pytest.raises(TuningError, match=r"timing: 'wall' is not allowed; allowed: gpu, eager, graph, interp"):
        TuneSettings(timing="wall")


def test_each_policy_is_a_study_of_its_own_and_gpu_studies_keep_their_names():
    names = {t: TuningKey.of("ag_gemm", "v1", PROBLEM, "hw", t).study_name(space_version="s1") for t in TIMINGS}
    assert len(set(names.values())) == len(TIMINGS)
    assert names["gpu"] == TuningKey.of("ag_gemm", "v1", PROBLEM, "hw").study_name(space_version="s1")
    assert names["eager"].endswith(":teager") and ":tgraph" in names["graph"]
    key = TuningKey.of("ag_gemm", "v1", PROBLEM, "hw", "graph")
    assert TuningKey.from_json(key.to_json()) == key
    assert TuningKey.from_json({k: v for k, v in key.to_json().items() if k != "timing"}).timing == "gpu"
    assert Job.of("ag_gemm", PROBLEM, TuneSettings(timing="eager")).label.endswith("(eager)")


def test_tables_tell_the_policies_of_one_shape_apart():
    """A sweep of two policies has a job per policy for one shape: the live rows and the tuned table say which."""
    from rich.console import Console

    from jointtune.autotune.tuner.results import JobResult
    from jointtune.autotune.workers.sweeps.progress import progress_table, summary_table

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
    with pytest.raises(TuningError, match=r"timing: 'graph' needs CUDA graphs.*use gpu, eager or interp"):
        measure(lambda: None, world, warmup=0, iters=1, timing="graph")
    with pytest.raises(TuningError, match="timing: 'wall' is not allowed"):
        measure(lambda: None, world, warmup=0, iters=1, timing="wall")


def test_the_interpreters_measurements_are_labelled_interp_whatever_was_asked():
    """On the CPU interpreter's hardware every policy is its wall time: the key, the study and so the record say
    interp (and the study keeps the name it had as a gpu study, so CPU sweeps resume); elsewhere nothing changes."""
    from jointtune.hardware import CPU_NAME, cpu_fingerprint
    from jointtune.timings import INTERPRETER_ID_PREFIX, measured_as

    cpu = cpu_fingerprint().hardware_id
    assert cpu.startswith(INTERPRETER_ID_PREFIX) and INTERPRETER_ID_PREFIX == CPU_NAME + "-"
    keys = {t: TuningKey.of("ag_gemm", "v1", PROBLEM, cpu, t) for t in ("gpu", "eager", "interp")}
    assert {k.timing for k in keys.values()} == {"interp"}
    assert len({k.study_name(space_version="s1") for k in keys.values()}) == 1
    assert not keys["gpu"].study_name(space_version="s1").endswith(":tinterp")
    gpu = "h200-sxm-sm90-x2-nvlink-a434a073"
    assert [measured_as(t, gpu) for t in TIMINGS] == list(TIMINGS)
    names = {TuningKey.of("ag_gemm", "v1", PROBLEM, gpu, t).study_name(space_version="s1") for t in TIMINGS}
    assert len(names) == len(TIMINGS)  # interp asked on a GPU's hardware is a study of its own (and is refused)


def test_interp_timing_is_refused_on_cuda_and_measures_the_wall_clock_in_the_interpreter():
    world = create_world("local", world_size=2)
    samples = measure(lambda: None, world, warmup=0, iters=3, timing="interp")
    assert len(samples) == 3

    class CudaLike:  # only the device's type is read before a policy is refused
        device = torch.device("cuda")

    with pytest.raises(TuningError, match=r"timing: 'interp' is the wall time of Triton's CPU interpreter"):
        measure(lambda: None, CudaLike(), warmup=0, iters=1, timing="interp")  # type: ignore[arg-type]


def test_a_cpu_sweep_records_and_shows_interp(tmp_path, families):
    """A jt_sleep study tuned in this (CPU) process with the default gpu policy: its record, the tuned table and
    db list say interp, and a call asking eager finds it first (named, not as a fallback)."""
    import contextlib
    import io

    from rich.console import Console

    from jointtune.autotune.runtime import policies
    from jointtune.autotune.tuner.results import collect
    from jointtune.autotune.tuner.studies import open_storage
    from jointtune.autotune.workers.control import SoloControl
    from jointtune.autotune.workers.coordinator import Coordinator, GroupInfo, GroupOptions
    from jointtune.autotune.workers.executor import RankExecutor
    from jointtune.autotune.workers.sweeps.progress import summary_table
    from jointtune.cli import main
    from jointtune.db import open_store
    from jointtune.hardware import detect

    hardware_id = detect().hardware_id
    assert hardware_id.startswith("cpu-interpreter-"), "this test runs where kernels run in the interpreter"
    url = f"sqlite:///{tmp_path / 'cpu.db'}"
    job = Job.of("jt_sleep", Problem.of({"M": 64}, dtype="float32", world_size=2), TuneSettings(trials=3, iters=2))
    executor = RankExecutor(SoloControl(), world_kind="local")
    try:
        Coordinator(url=url, jobs=lambda: [job], group=GroupInfo("g-interp", "local", 1), control=SoloControl(),
                    executor=executor, options=GroupOptions(heartbeat_s=1, grace_s=3, poll_s=0.05)).run()  # fmt: skip
    finally:
        executor.close()
    (record,) = open_store(url).list_records()
    assert record.timing == "interp"
    console = Console(width=250, record=True)
    console.print(summary_table(collect(open_storage(url), [job], hardware_id=hardware_id)))
    assert " interp " in console.export_text() and " gpu " not in console.export_text()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        main(["db", "list", "--db", url])
    assert " interp " in out.getvalue() and " gpu " not in out.getvalue()
    assert policies.chain("eager", hardware_id=hardware_id) == ("interp", "eager", "gpu")
