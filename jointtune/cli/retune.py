"""`jointtune retune`: find the keys a new kernel or space version left behind, and tune them again.

After an upgrade that changes a kernel family's code (its version is derived from everything its kernels
import, `jointtune.kernels.runtime.version`), no lookup finds the records measured on the old code. This command lists
those keys (and the keys whose record was searched in an older space), then re-tunes the ones tuned on this machine
with the settings their last study used, through the same runner as `tune` and `sweep` (progress, resume, summary).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table


def retune(
    db: Annotated[
        str | None,
        typer.Option("--db", help="database URL of the store (default: $JOINTTUNE_DB_URL or the per-user SQLite file)"),
    ] = None,
    kernel: Annotated[str | None, typer.Option(help="only this kernel family")] = None,
    list_only: Annotated[bool, typer.Option("--list", help="only list the keys left behind; tune nothing")] = False,
    trials: Annotated[
        int | None, typer.Option(min=1, help="trial budget per key (default: what its last study used)")
    ] = None,
    groups: Annotated[
        int | None, typer.Option(min=1, help="tuning groups on this node (default: all GPUs; one on the CPU)")
    ] = None,
    report: Annotated[str | None, typer.Option(help="directory for tuning-curve PNGs and results.json")] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="module to import first (plug-in family)")
    ] = None,
) -> None:
    """List the keys whose best record is under an old kernel or space version, and re-tune those of this machine."""
    from jointtune._command import jointtune_command
    from jointtune.autotune.tuner.stale import find_stale
    from jointtune.autotune.workers.runner import prepare_interpreter
    from jointtune.cli._checks import existing_store_url, prepare_report_dir
    from jointtune.cli.db import shape_text
    from jointtune.cli.tune import _console, _import_all, _options, _tune_and_summarise
    from jointtune.db import Store, redact_url
    from jointtune.hardware import detect
    from jointtune.kernels import get_family

    url = existing_store_url(db)
    options = _options(None, None)
    _import_all(imports or [])
    if kernel is not None:
        get_family(kernel)  # an unknown name: one line naming the known ones
    report_dir = prepare_report_dir(report)
    prepare_interpreter()  # the CPU's hardware id is the interpreter's when no GPU is visible
    hardware_id = detect().hardware_id
    with Store(url) as store:
        stale, unknown = find_stale(store, url, hardware_id=hardware_id, kernel=kernel, trials=trials)
        console = _console()
        if unknown:
            console.print(
                f"not checked (no family of that name in this process; --import its module): {', '.join(unknown)}",
                markup=False, highlight=False,
            )  # fmt: skip
        if not stale:
            console.print(f"{store.display_url}: every record is under today's kernel and space versions",
                          markup=False, highlight=False)  # fmt: skip
            return
        table = Table(title=f"{store.display_url}: {len(stale)} keys left behind", title_justify="left")
        for name in ("key", "hardware", "p50 µs", "changed", "here"):
            table.add_column(name, justify="right" if name == "p50 µs" else "left")
        for key in stale:
            action = "re-tune" if key.job is not None else key.why_not or ""
            if key.refused and key.job is not None:
                action += " (today's space refuses its config: replaced)"
            rec = key.record
            label = f"{rec.kernel} {shape_text(rec.kernel, rec.shape)} {rec.dtype} w{rec.world_size} {rec.timing}"
            table.add_row(label, key.record.hardware_id, f"{key.record.latency_p50_us:.1f}", key.reason, action)
        console.print(table)
        jobs = list(dict.fromkeys(key.job for key in stale if key.job is not None))  # two raw lengths, one bucket
        if list_only or not jobs:
            if jobs:
                again = f"{jointtune_command()} retune" + ("" if db is None else f" --db {redact_url(url)}")
                console.print(f"next: {again} (re-tunes the {len(jobs)} keys of this machine)",
                              markup=False, highlight=False)  # fmt: skip
            return
        for key in stale:  # a config today's space refuses is never served: let the new record take its key
            if key.refused and key.job is not None:
                store.delete_record(key.record.id)
    _tune_and_summarise(
        jobs, what="jointtune retune", url=url, imports=imports or [], groups=groups, options=options,
        report=report_dir, report_hint=None,
    )  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("retune")(retune)
