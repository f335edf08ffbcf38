"""Tuning curves as PNG files (matplotlib Agg: no display needed) plus the results as JSON.

One plot per shape: every counted trial's p50 (failed trials as red crosses along the top, with
their reason in the legend), the best so far as a step line, and the baseline as a dashed line.

Example:
    >>> paths = write_report(results, "reports/")        # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from jointtune.autotune.tuner.results import JobResult, job_label


def _file_stem(result: JobResult) -> str:
    job = result.job
    shape = "_".join(f"{k}{v}" for k, v in job.shape)
    timing = "" if job.settings.timing == "gpu" else f"_{job.settings.timing}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{job.kernel}_{shape}_{job.dtype}_w{job.world_size}{timing}")


def plot_curve(result: JobResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result.curve()
    fig, ax = plt.subplots(figsize=(7, 4))
    ok = [(i, v) for i, v, _ in curve if v is not None]
    if ok:
        ax.scatter([i for i, _ in ok], [v for _, v in ok], s=14, color="tab:blue", label="trial p50")
        best, xs, ys = float("inf"), [], []
        for i, v, _ in curve:
            if v is not None:
                best = min(best, v)
            if best < float("inf"):
                xs.append(i)
                ys.append(best)
        ax.step(xs, ys, where="post", color="tab:green", label="best so far")
    if result.baseline_us:
        ax.axhline(result.baseline_us, color="gray", linestyle="--", label="baseline")
    top = max([v for _, v in ok] + [result.baseline_us or 0.0] + [1.0])
    reasons = sorted({r for _, v, r in curve if v is None and r})
    for reason in reasons:
        xs = [i for i, v, r in curve if v is None and r == reason]
        ax.scatter(xs, [top * 1.05] * len(xs), marker="x", color="tab:red", label=f"failed: {reason}")
    values = [v for _, v in ok] + ([result.baseline_us] if result.baseline_us else [])
    if values and max(values) > 20 * min(values):  # interpreted kernels vs torch, say
        ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel("latency p50 (µs)")
    speed = f", {result.speedup:.2f}x vs baseline" if result.speedup else ""
    ax.set_title(f"{job_label(result.job)}{speed}", fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # a job with no trial yet has nothing to label
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(results: Sequence[JobResult], directory: str | Path) -> list[Path]:
    """One PNG per job and `results.json`; returns the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [plot_curve(r, directory / f"{_file_stem(r)}.png") for r in results]
    summary = directory / "results.json"
    summary.write_text(json.dumps([r.to_json() for r in results], indent=2, sort_keys=True))
    return [*paths, summary]
