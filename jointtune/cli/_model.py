"""`jointtune tune --model CONFIG --tp W --tokens ... --kv-lens ...`: every fused-op shape of a model, one sweep.

The model's ops (`jointtune.tp.shapes`) become jobs (`autotune.workers.sweeps.models`), tuned by the same machinery as
any sweep (resume, live progress, ETA, the tuned table, `--report`); the run ends with the model's per-layer table
(each op's shape per token count and layout, the chosen mode, its speedup against the best unfused path, and each
layout's tuned ops of one layer together), and `--export FILE` writes the tuned records of exactly these
shapes as a bundle (`jointtune import FILE` on the serving machines).

Example:
    >>> check_export_path(None) is None
    True
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.tuner.results import JobResult
    from jointtune.autotune.tuner.settings import Job
    from jointtune.autotune.workers.sweeps.models import ModelPlan


def check_export_path(text: str | None) -> Path | None:
    """`--export`'s file, checked before any tuning: not a directory, in a directory that exists."""
    if text is None:
        return None
    path = Path(text)
    allowed = "allowed: a file path (new or to replace) in an existing directory"
    if not text.strip() or path.is_dir():
        raise TuningError(f"--export: {text!r} is a directory or empty; {allowed}")
    if not path.resolve().parent.is_dir():
        raise TuningError(f"--export: {str(path.parent)!r} does not exist; {allowed}")
    return path


def _dims(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def layer_table(plan: ModelPlan, results: Sequence[JobResult]) -> Table:
    """The model's per-layer table (`layer_rows`)."""
    from jointtune.autotune.workers.sweeps.models import layer_rows

    table = Table(title=f"{plan.name} at TP={plan.tp}: each op of a decoder layer", title_justify="left")
    columns = ("tokens", "op", "layout", "kernel", "shape", "W", "mode", "best µs", "unfused µs", "speedup", "note")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in layer_rows(plan, results):
        speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
        table.add_row(str(row["tokens"]), row["op"], row["layout"], row["kernel"], _dims(row["shape"]),
                      str(row["world_size"]), row["mode"] or "-", _num(row["best_us"], ".1f"),
                      _num(row["baseline_us"], ".1f"), speedup, row["note"])  # fmt: skip
    return table


def write_bundle_of(url: str, jobs: Sequence[Job], path: Path, hardware_id: str) -> int:
    """The stored records of `jobs` (this hardware, each job's timing policy) as one bundle file; returns the count.

    Written whole to a `.partial` file and moved into place, so a failed export leaves no half bundle."""
    from jointtune._version import __version__
    from jointtune.autotune.tuner.keys import TuningKey
    from jointtune.db import PUBLISHED, Store
    from jointtune.kernels import get_family
    from jointtune.server.bundle import parse_bundle
    from jointtune.server.schemas import SCHEMA_VERSION

    with Store(url) as store:
        profile = store.get_hardware(hardware_id)
        records = []
        for job in jobs:
            version = get_family(job.kernel).version
            record = store.best(TuningKey.of(job.kernel, version, job.problem, hardware_id, job.settings.timing))
            if record is not None:
                records.append({name: getattr(record, name) for name in PUBLISHED})
    if profile is None:
        raise TuningError(f"--export: the store has no records of {hardware_id} to export (nothing was tuned)")
    bundle = {
        "schema_version": SCHEMA_VERSION,
        "tuner_version": __version__,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "hardware": {"hardware_id": profile.hardware_id, "name": profile.name, "fingerprint": profile.fingerprint},
        "records": records,
    }
    text = json.dumps(bundle, indent=1, allow_nan=False) + "\n"
    parse_bundle(text, source=str(path))  # what `jointtune import` will read: checked before it is written
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        raise TuningError(f"--export: {str(path)!r} can't be written ({exc.strerror})") from None
    finally:
        partial.unlink(missing_ok=True)
    return len(records)


def model_epilogue(plans: Sequence[ModelPlan], *, url: str, export: Path | None,
                   console: Console) -> Callable[[Sequence[JobResult]], None]:  # fmt: skip
    """What a tuning run of models prints (and writes) last: each model's per-layer table, then the bundle."""

    def epilogue(results: Sequence[JobResult]) -> None:
        from jointtune._command import jointtune_command
        from jointtune.hardware import detect

        for plan in plans:
            console.print(layer_table(plan, results))
        console.print("layout per token count: the layer picks sp or standard from measured steps (LayoutRule); "
                      "standard rows are GEMM + all-reduce with the decoder's residual + RMSNorm epilogue "
                      "(down_last: a stack's last layer, residual only)", markup=False, highlight=False)  # fmt: skip
        if export is not None:
            jobs = list(dict.fromkeys(job for plan in plans for job in plan.jobs))
            count = write_bundle_of(url, jobs, export, detect().hardware_id)
            again = f"{jointtune_command()} import {shlex.quote(str(export))}"
            console.print(f"exported: {count} of {len(jobs)} tuned records to {export} ({again})",
                          markup=False, highlight=False, soft_wrap=True)  # fmt: skip

    return epilogue


def describe(plan: ModelPlan) -> str:
    """One line for the run's title."""
    return f"jointtune tune --model {plan.name} --tp {plan.tp}: {len(plan.jobs)} shapes of {len(plan.ops)} ops"


def plan_from_options(model: str, *, tp: int | None, tokens: str | None, kv_lens: str | None, attention: str,
                      decode_max: int, dtype: str, settings: Any) -> ModelPlan:  # fmt: skip
    """The plan `tune --model` runs, every option checked (one line naming the option otherwise)."""
    from jointtune.autotune.workers.sweeps.models import model_plan, parse_counts

    if tp is None:
        raise TuningError("--tp: required with --model (the tensor-parallel degree, e.g. --tp 2)")
    if tokens is None:
        raise TuningError("--tokens: required with --model (token counts of a step, e.g. --tokens 1,8,32,4096)")
    counts = parse_counts("--tokens", tokens)
    lens = parse_counts("--kv-lens", kv_lens) if kv_lens is not None else []
    return model_plan(model, tp=tp, tokens=counts, kv_lens=lens, dtype=dtype, settings=settings, attention=attention,
                      decode_max=decode_max)  # fmt: skip
