"""What a person watching a sweep sees: a live table per shape, then the tuned table.

On a terminal the table redraws in place (rich Live). In a log (CI, `make sweep | tee`) a line is
printed whenever a shape finishes another trial, so logs stay readable.

Example:
    >>> with ProgressView(console, lambda: collect(storage, jobs, hardware_id=hw)) as view:  # doctest: +SKIP
    ...     while running(): view.refresh()
    >>> console.print(summary_table(results))                                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from jointtune.autotune.results import JobResult, job_label, shape_label


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _speedup(result: JobResult) -> str:
    return "-" if result.speedup is None else f"{result.speedup:.2f}x"


def _failures(result: JobResult) -> str:
    parts = [f"{reason} {n}" for reason, n in sorted(result.state.failures.items())]
    invalid = result.state.kinds["invalid"]
    if invalid:
        parts.append(f"(invalid {invalid})")
    return ", ".join(parts) or "-"


def _shape(result: JobResult) -> str:
    return shape_label(result.job)


def progress_table(results: Sequence[JobResult], *, title: str = "tuning") -> Table:
    table = Table(title=title, title_justify="left")
    for column in (
        "kernel",
        "shape",
        "dtype",
        "W",
        "trials",
        "best µs",
        "baseline µs",
        "speedup",
        "failures",
        "status",
    ):
        table.add_column(column, justify="right" if column in ("W", "trials", "best µs", "baseline µs") else "left")
    for r in results:
        status = r.done_reason or ("running" if r.state.running else "waiting")
        table.add_row(
            r.job.kernel,
            _shape(r),
            r.job.dtype,
            str(r.job.world_size),
            f"{r.counted}/{r.budget}",
            _us(r.best_us),
            _us(r.baseline_us),
            _speedup(r),
            _failures(r),
            status,
        )
    return table


def _config_text(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{k}={v}" for k, v in config.items())


def summary_table(results: Sequence[JobResult], *, title: str = "tuned configs") -> Table:
    """The tuned table: best config per shape with its latency and the speedup over baseline."""
    table = Table(title=title, title_justify="left")
    for column in ("kernel", "shape", "dtype", "W", "trials", "best µs", "baseline µs", "speedup", "config"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(
            r.job.kernel,
            _shape(r),
            r.job.dtype,
            str(r.job.world_size),
            str(r.counted),
            _us(r.best_us),
            _us(r.baseline_us),
            _speedup(r),
            _config_text(r.best_config) if r.best_us is not None else "FAILED: " + _failures(r),
        )
    return table


class ProgressView:
    """Redraws the progress table from `read()` on each `refresh()`."""

    def __init__(self, console: Console, read: Callable[[], Sequence[JobResult]], *, title: str = "tuning"):
        self.console, self.read, self.title = console, read, title
        self._live: Live | None = None
        self._seen: dict[str, tuple[int, str | None]] = {}

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        self.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def refresh(self) -> Sequence[JobResult]:
        results = self.read()
        if self._live is not None:
            self._live.update(progress_table(results, title=self.title))
            return results
        for r in results:
            mark = (r.counted, r.done_reason)
            if self._seen.get(r.study_name, (0, None)) != mark:
                self._seen[r.study_name] = mark
                status = f" [{r.done_reason}]" if r.done_reason else ""
                self.console.print(
                    f"{job_label(r.job)}: {r.counted}/{r.budget} trials, best {_us(r.best_us)} µs, "
                    f"baseline {_us(r.baseline_us)} µs, speedup {_speedup(r)}, failures {_failures(r)}{status}",
                    highlight=False,
                )
        return results
