"""What a newcomer sees while a run takes long: a GPU-sized shape on the CPU is named as such before it starts,
and a log that has nothing new to say still says, once a minute, that trials run and how to stop."""

from __future__ import annotations

from rich.console import Console

from jointtune.autotune.tuner.results import JobResult
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import StudyState
from jointtune.autotune.workers.sweeps import progress
from jointtune.cli._summary import print_header
from jointtune.search_spaces import Problem

CPU = "cpu-interpreter-x1-none-1a2b3c4d"


def _result(shape: str) -> JobResult:
    problem = Problem.of(dict(zip("MNK", map(int, shape.split("x")))), dtype="bf16", world_size=2)
    return JobResult(Job.of("ag_gemm", problem, TuneSettings(trials=64)), f"study-{shape}", hardware_id=CPU)


def test_a_gpu_sized_shape_on_the_cpu_is_named_before_it_runs() -> None:
    console = Console(width=300, record=True)
    results = [_result("8192x4096x12288"), _result("256x256x256")]
    print_header(console, what="jointtune tune", url="sqlite:///x.db", hardware_id=CPU, results=results, groups=1)
    text = console.export_text()
    assert "note: ag_gemm M=8192,N=4096,K=12288 bfloat16 w2 is GPU-sized: in the CPU interpreter one trial" in text
    assert "M=256,N=256,K=256" not in text  # a CPU-sized shape gets no note
    assert "timing interp: the interpreter's wall time, not GPU time" in text
    console = Console(width=300, record=True)
    print_header(console, what="t", url="sqlite:///x.db", hardware_id="h100-x", results=results, groups=1)
    assert "GPU-sized" not in console.export_text()  # on a GPU it is what it is for


def test_a_quiet_log_hears_that_trials_still_run(monkeypatch) -> None:
    running = _result("8192x4096x12288")
    running.state = StudyState()
    running.state.kinds["running"] = 1
    console = Console(width=300, record=True, force_terminal=False)
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    with progress.ProgressView(console, lambda: [running], title="jointtune tune") as view:
        view.refresh()
    text = console.export_text()
    assert "jointtune tune: no trial finished in the last" in text and "1 running; Ctrl-C stops" in text
