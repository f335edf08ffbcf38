"""What a person watching a sweep sees: live progress per shape and for the whole sweep, then the tuned table.

On a terminal a table redraws in place (rich Live): a bar per shape with its trials, best and baseline
latency, speed-up, ETA and status, and under it a bar for the sweep (shapes and trials done, elapsed
time, ETA). In a log (CI, `make sweep | tee`) there is no redrawing: a line is printed whenever a
shape finishes another trial, and one when it is done, each with the elapsed time and ETA.
Everything that comes from a study (done reasons, failure reasons) is printed as plain text, never
as rich markup: a reason such as "[trials]" must reach the reader.

Example:
    >>> with ProgressView(console, lambda: collect(storage, jobs, hardware_id=hw)) as view:  # doctest: +SKIP
    ...     while running(): view.refresh()
    >>> console.print(summary_table(results))                                              # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from jointtune.autotune.tuner.results import JobResult, job_label, shape_label
from jointtune.autotune.workers.sweeps.eta import fmt_duration, job_etas, total_eta_s


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def _speedup(result: JobResult) -> str:
    return "-" if result.speedup is None else f"{result.speedup:.2f}x"


def failures_text(result: JobResult) -> str:
    """Failed trials by reason, and proposals the space refused (which cost no trial) in parentheses."""
    parts = [f"{reason} {n}" for reason, n in sorted(result.state.failures.items())]
    refused = result.state.refused_count
    if refused:
        parts.append(f"(refused {refused}, no trial)")
    return ", ".join(parts) or "-"


def status_text(result: JobResult, *, already: bool = False) -> str:
    """One of: already tuned, done: REASON, running, waiting."""
    if result.done_reason is not None:
        return "already tuned" if already else f"done: {result.done_reason}"
    return "running" if result.state.running else "waiting"


def _bar_counts(result: JobResult) -> tuple[int, int]:
    """(trials done, trials it will have run): a job stopped early is full."""
    if result.done_reason is not None:
        return result.counted, max(result.counted, 1)
    budget = result.budget if result.budget > 0 else result.job.settings.trials
    return result.counted, max(budget, result.counted, 1)


_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _row_label(result: JobResult, *, with_kernel: bool, with_timing: bool = False) -> str:
    job = result.job
    parts = [job.kernel] if with_kernel else []
    parts += [shape_label(job), _SHORT_DTYPES.get(job.dtype, job.dtype), f"w{job.world_size}"]
    if with_timing:  # a sweep of several policies has a job per policy: the rows would read alike
        parts.append(result.timing)
    return " ".join(parts)


def progress_table(
    results: Sequence[JobResult],
    *,
    title: str = "tuning",
    etas: Sequence[float | None] | None = None,
    already: Collection[str] = (),
) -> Table:
    """One row per job: a bar of its trials, best and baseline latency, speed-up, ETA, status."""
    kernels = sorted({r.job.kernel for r in results})
    several_timings = len({r.timing for r in results}) > 1
    if len(kernels) == 1:
        title = f"{title} · {kernels[0]}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True)
    right = ("trials", "best µs", "baseline µs", "speedup", "ETA")
    show_failures = any(failures_text(r) != "-" for r in results)
    columns = ("shape", "progress", *right, *(("failures",) if show_failures else ()), "status")
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in right else "left",
            no_wrap=column in ("shape", "progress"),
            overflow="fold",
        )
    for i, r in enumerate(results):
        done, total = _bar_counts(r)
        eta = etas[i] if etas is not None else None
        row: list[Any] = [
            Text(_row_label(r, with_kernel=len(kernels) > 1, with_timing=several_timings)),
            ProgressBar(total=total, completed=done, width=12),
            f"{r.counted}/{r.budget}",
            _us(r.best_us),
            _us(r.baseline_us),
            _speedup(r),
            "-" if r.done_reason else fmt_duration(eta),
        ]
        if show_failures:
            row.append(Text(failures_text(r)))
        row.append(Text(status_text(r, already=r.study_name in already)))
        table.add_row(*row)
    return table


def _config_text(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{k}={v}" for k, v in config.items())


def summary_table(results: Sequence[JobResult], *, title: str = "tuned configs") -> Table:
    """The tuned table: best config per shape with its latency and the speedup over baseline."""
    table = Table(title=title, title_justify="left")
    columns = ("kernel", "shape", "dtype", "W", "timing", "trials", "best µs", "baseline µs", "speedup", "config")
    for column in columns:
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(
            r.job.kernel,
            shape_label(r.job),
            r.job.dtype,
            str(r.job.world_size),
            r.timing,
            str(r.counted),
            _us(r.best_us),
            _us(r.baseline_us),
            _speedup(r),
            Text(_config_text(r.best_config) if r.best_us is not None else "FAILED: " + failures_text(r)),
        )
    return table


#: seconds without a line after which a log hears that trials still run
QUIET_S = 60.0


class ProgressView:
    """Shows where `read()`'s jobs stand on each `refresh()`: live on a terminal, line by line in a log.

    `parallel`: groups sharing the jobs (for the sweep's ETA); `already`: study names that were done
    before this run started (shown as already tuned, never reported as progress).
    """

    def __init__(
        self,
        console: Console,
        read: Callable[[], Sequence[JobResult]],
        *,
        title: str = "tuning",
        parallel: int = 1,
        already: Collection[str] = (),
    ):
        self.console, self.read, self.title = console, read, title
        self.parallel, self.already = max(1, parallel), frozenset(already)
        self._live: Live | None = None
        self._seen: dict[str, tuple[int, str | None]] = {}
        self._start = time.monotonic()
        self._pace: tuple[float, int, float] | None = None  # (when, trials, trial seconds) at first progress
        self._said = self._start  # when the log last got a line

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        self.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    def _overhead_s(self, results: Sequence[JobResult]) -> float:
        """Wall time per trial spent between trials, as observed since the first trial ended here
        (group start-up before it is not a per-trial cost)."""
        counted = sum(r.counted for r in results)
        trial_s = sum(r.state.elapsed_s for r in results)
        now = time.monotonic()
        if self._pace is None:
            self._pace = (now, counted, trial_s)
            return 0.0
        since, counted0, trial_s0 = self._pace
        new = counted - counted0
        if new <= 0:
            return 0.0
        return max(0.0, ((now - since) * self.parallel - (trial_s - trial_s0)) / new)

    def refresh(self) -> Sequence[JobResult]:
        results = self.read()
        overhead = self._overhead_s(results)
        etas = job_etas(results, overhead_s=overhead)
        total_eta = total_eta_s(etas, self.parallel)
        if self._live is not None:
            table = progress_table(results, title=self.title, etas=etas, already=self.already)
            self._live.update(Group(table, self._overall(results, total_eta)))
            return results
        for r, eta in zip(results, etas):
            mark = (r.counted, r.done_reason)
            if r.study_name in self.already or self._seen.get(r.study_name, (0, None)) == mark:
                continue
            self._seen[r.study_name] = mark
            tail = f"done: {r.done_reason}" if r.done_reason else f"ETA {fmt_duration(eta)}"
            self._line(
                f"{job_label(r.job)}: {r.counted}/{r.budget} trials, best {_us(r.best_us)} µs, "
                f"baseline {_us(r.baseline_us)} µs, speedup {_speedup(r)}, failures {failures_text(r)}, {tail}"
            )
            if r.done_reason:
                self._line(self._sweep_line(results, total_eta))
        if time.monotonic() - self._said >= QUIET_S:  # a long trial (a GPU-sized shape on the CPU): say it runs
            running = sum(r.state.running for r in results)
            self._line(
                f"{self.title}: no trial finished in the last {fmt_duration(time.monotonic() - self._said)}, "
                f"{running} running; Ctrl-C stops (finished trials stay stored; the same command resumes)"
            )
        return results

    def _line(self, text: str) -> None:
        self.console.print(f"[{fmt_duration(self.elapsed_s())}] {text}", markup=False, highlight=False)
        self._said = time.monotonic()

    def _sweep_line(self, results: Sequence[JobResult], eta: float | None) -> str:
        done = sum(r.done_reason is not None for r in results)
        counts = [_bar_counts(r) for r in results]
        trials = f"{sum(c for c, _ in counts)}/{sum(t for _, t in counts)} trials"
        left = "" if done == len(results) else f", ETA {fmt_duration(eta)}"
        return f"{self.title}: {done}/{len(results)} shapes done, {trials}{left}"

    def _overall(self, results: Sequence[JobResult], eta: float | None) -> Table:
        counts = [_bar_counts(r) for r in results]
        done = sum(r.done_reason is not None for r in results)
        trials = f"{sum(c for c, _ in counts)}/{sum(t for _, t in counts)} trials"
        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            Text(" all", style="bold"),
            ProgressBar(total=max(1, sum(t for _, t in counts)), completed=sum(c for c, _ in counts), width=20),
            Text(f"{done}/{len(results)} shapes · {trials} · elapsed {fmt_duration(self.elapsed_s())}"),
            Text(f"· ETA {fmt_duration(eta)}", style="bold"),
        )
        return grid
