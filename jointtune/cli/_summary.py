"""What the tuning commands print around the live progress: a header, then a closing summary.

The header says what runs where before anything starts: the sweep (or shape), the profile, the
database and the hardware, and which shapes a re-run finds already tuned. The summary says how it
went, where the results are, and what to run next (`jointtune db list`, `jointtune serve` and its
dashboard, `--report`), each written as this shell can run it (`jointtune_command`: `.venv/bin/jointtune`
until the venv is activated). On the CPU it also says why the unfused baseline wins most shapes there:
the fused modes run in Triton's interpreter.

Example:
    >>> next_commands("sqlite:////tmp/jt.db", default_url="sqlite:////tmp/jt.db", report_hint=None)[0]  # doctest: +SKIP
    ('jointtune db list', 'the stored configs: the best one per shape')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from jointtune._command import jointtune_command
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.tuner.results import JobResult

DASHBOARD = "http://127.0.0.1:8000/dashboard"
#: a shape whose dims multiply to more than this is a GPU's work: minutes per trial in the CPU interpreter
#: (the cpu profile's largest, 512x512x512, is 2^27)
GPU_SIZED = 2**28
#: why a study is done, as a sentence ends ("3 used their trial budget")
_DONE = {
    "trials": "used their trial budget",
    "time": "used their time budget",
    "patience": "stopped by patience",
    "exhausted": "measured every config",
}


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _say(console: Console, text: str = "", **style: object) -> None:
    # never markup (reasons and paths are data), never wrapped (paths and commands are copied)
    console.print(text, markup=False, highlight=False, soft_wrap=True, **style)  # type: ignore[arg-type]


def _db_flag(url: str, default_url: str) -> str:
    from jointtune.db import redact_url

    return "" if url == default_url else f" --db {redact_url(url)}"


def print_header(
    console: Console,
    *,
    what: str,
    url: str,
    hardware_id: str,
    results: Sequence[JobResult],
    groups: int,
    profile: str | None = None,
) -> None:
    """What is about to run and where; which shapes a re-run finds already tuned."""
    from jointtune.autotune.tuner.results import job_label
    from jointtune.db import redact_url
    from jointtune.hardware import CPU_NAME

    parts = [what, *([f"profile {profile}"] if profile else []), plural(len(results), "shape")]
    parts.append(plural(groups, "group"))
    _say(console, " · ".join(parts), style="bold")
    _say(console, f"  database: {redact_url(url)}")
    hardware = f"  hardware: {hardware_id}"
    if hardware_id.startswith(CPU_NAME):
        hardware += (
            " (no GPU: Triton's CPU interpreter with simulated ranks; fused modes run slowly there; "
            "timing interp: the interpreter's wall time, not GPU time)"
        )
    _say(console, hardware)
    if hardware_id.startswith(CPU_NAME):
        for r in results:
            if r.done_reason is None and math.prod(dict(r.job.shape).values()) > GPU_SIZED:
                _say(console, f"  note: {job_label(r.job)} is GPU-sized: in the CPU interpreter one trial of it can "
                              "take many minutes (the bars move when a trial ends); shapes such as 256x256x256 take "
                              "seconds (examples/sweep.yaml, profile cpu)")  # fmt: skip
    done = [r for r in results if r.done_reason is not None]
    if done and len(done) == len(results):
        _say(console, f"  nothing to tune: every shape is already tuned in this database ({_reasons(done)})")
        _say(console, "  to tune further, raise `trials` (or `time_budget`) or use another --db")
    elif done:
        _say(console, f"  already tuned: {len(done)} of {len(results)} shapes ({_reasons(done)}); the others run now")


def _reasons(results: Sequence[JobResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.done_reason or "?"] = counts.get(r.done_reason or "?", 0) + 1
    return ", ".join(f"{n} {_DONE.get(reason, 'stopped: ' + reason)}" for reason, n in counts.items())


def next_commands(url: str, *, default_url: str, report_hint: str | None) -> list[tuple[str, str]]:
    """(command, what it does) to run after tuning."""
    db, command = _db_flag(url, default_url), jointtune_command()
    out = [
        (f"{command} db list{db}", "the stored configs: the best one per shape"),
        (f"{command} serve{db}", f"the config service for @joint_autotune and REST; dashboard at {DASHBOARD}"),
    ]
    if report_hint:
        out.append((report_hint, "tuning curves (PNG) and results.json per shape"))
    return out


def print_interrupted(
    console: Console, results: Sequence[JobResult], *, url: str, elapsed_s: float, again: str
) -> None:
    """What a Ctrl-C leaves: the finished trials and best configs are stored, and the same command resumes."""
    from jointtune.autotune.workers.sweeps.eta import fmt_duration
    from jointtune.db import redact_url

    trials = sum(r.counted for r in results)
    tuned = sum(r.best_us is not None for r in results)
    _say(console, f"interrupted after {fmt_duration(elapsed_s)}: {plural(trials, 'trial')} finished; the best config "
                  f"of {plural(tuned, 'shape')} so far is in the store at {redact_url(url)}", style="bold")  # fmt: skip
    _say(console, f"to resume where it stopped, run the same command again: {again}")


def write_report_now(results: Sequence[JobResult], report: Path) -> list[Path]:
    from jointtune.autotune.workers.sweeps.report import write_report

    try:
        return write_report(results, report)
    except OSError as exc:
        raise TuningError(f"--report: {str(report)!r} could not be written ({exc.strerror})") from None


def print_summary(
    console: Console,
    results: Sequence[JobResult],
    *,
    url: str,
    elapsed_s: float,
    already: Sequence[str] = (),
    report: Path | None = None,
    report_hint: str | None = None,
    hardware_id: str = "",
) -> None:
    """The tuned table, how the run went, where the results are and the next commands.

    Exits 1 when a shape could not be tuned at all (every trial failed).
    """
    from jointtune.autotune.tuner.results import job_label
    from jointtune.autotune.workers.sweeps.eta import fmt_duration
    from jointtune.autotune.workers.sweeps.progress import summary_table
    from jointtune.db import redact_url, resolve_db_url
    from jointtune.hardware import CPU_NAME

    console.print(summary_table(results))
    now = [r for r in results if r.study_name not in already]
    trials = sum(r.counted for r in now)
    fused = [r for r in results if r.best_config and r.best_config.get("mode") not in (None, "baseline")]
    line = f"done in {fmt_duration(elapsed_s)}: {plural(len(now), 'shape')} tuned now ({plural(trials, 'trial')})"
    if already:
        line += f", {len(already)} already tuned"
    _say(console, line + f"; a fused mode beat the baseline on {len(fused)} of {len(results)}", style="bold")
    _say(console, f"results: the store at {redact_url(url)} (best config per shape; trial history in its studies)")
    if now:
        _say(console, "how each shape went (why it stopped, proposals the space refused, warm starts):")
        for r in now:
            _say(console, f"  {r.summary_line()}")
    if report is not None:
        paths = write_report_now(results, report)
        _say(console, f"report:  {len(paths)} files in {report}/ (tuning curves as PNG, results.json)")
    if hardware_id.startswith(CPU_NAME):
        _say(console, "CPU: the fused modes ran in Triton's interpreter (Python, one program at a time, milliseconds")
        _say(console, "per launch), so the unfused baseline wins most shapes here. On GPUs they overlap the NVLink")
        _say(console, "transfer with the computation (GEMM or attention): that is what the gpu profile tunes.")
    _say(console, "next:")
    commands = next_commands(url, default_url=resolve_db_url(None), report_hint=None if report else report_hint)
    width = max(len(command) for command, _ in commands)
    for command, what in commands:  # pasteable into a shell: the description is a comment
        _say(console, f"  {command.ljust(width)}  # {what}")
    failed = [job_label(r.job) for r in results if r.failed_entirely]
    if failed:
        _say(console, f"no config could be measured for: {', '.join(failed)}", style="red")
        raise SystemExit(1)  # typer.Exit is swallowed by main()'s standalone_mode=False
