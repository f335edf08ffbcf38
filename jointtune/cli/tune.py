"""`jointtune tune`, `jointtune sweep` and `jointtune worker`: offline tuning from the command line.

- `tune`: one (kernel, shape) now, on this node.
- `sweep FILE`: register a sweep file's jobs in the storage and tune this node's profile of them.
- `worker --storage URL --sweep NAME`: join a registered sweep; under `torchrun
  --nproc-per-node=<GPUs>` this process is one rank of the node's group, otherwise it launches
  its own groups. Groups on many nodes share the sweep's studies through the storage.

All three print a live progress table, then the tuned table, and exit 1 when a shape could not
be tuned at all (every trial failed); bad input exits 2 with one line naming the field.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.coordinator import GroupOptions
    from jointtune.autotune.results import JobResult

_DB_HELP = "database URL of the store and the Optuna studies (default: $JOINTTUNE_DB_URL or the per-user SQLite file)"


def _options(heartbeat: int | None, grace: int | None) -> GroupOptions:
    """Heartbeat and grace from the options, else $JOINTTUNE_HEARTBEAT_S / $JOINTTUNE_GRACE_S."""
    from jointtune.autotune.coordinator import GroupOptions

    defaults = GroupOptions()
    beat = heartbeat or int(os.environ.get("JOINTTUNE_HEARTBEAT_S", defaults.heartbeat_s))
    grace_s = grace or int(os.environ.get("JOINTTUNE_GRACE_S", defaults.grace_s))
    if beat < 1 or grace_s <= beat:
        raise TuningError(
            f"heartbeat/grace: {beat}/{grace_s} s is not allowed; need heartbeat >= 1 and grace > heartbeat"
        )
    return GroupOptions(heartbeat_s=beat, grace_s=grace_s)


def _import_all(modules: list[str]) -> None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise TuningError(f"--import: {module!r} can't be imported ({exc})") from None


def _restriction_value(text: str) -> int | bool | str:
    try:
        return int(text)
    except ValueError:
        return {"true": True, "false": False}.get(text.lower(), text)


def parse_restrictions(items: list[str]) -> dict[str, list[int | bool | str]]:
    """`["BLOCK_K=64", "mode=ce,push"]` as {name: values}; the space checks names and values."""
    out: dict[str, list[int | bool | str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not name.strip().isidentifier() or not parts:
            raise TuningError(f"--restrict: {item!r} is not allowed; write NAME=VALUE[,VALUE...], e.g. BLOCK_K=64,128")
        out.setdefault(name.strip(), []).extend(_restriction_value(v) for v in parts)
    return out


def _console() -> Console:
    # Logs (CI, `| tee`) get wide lines instead of rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _finish(results: list[JobResult], report: Path | None, console: Console) -> None:
    from jointtune.autotune.progress import summary_table
    from jointtune.autotune.results import job_label

    console.print(summary_table(results))
    if report is not None:
        from jointtune.autotune.report import write_report

        paths = write_report(results, report)
        console.print(f"report: {len(paths)} files in {report}", highlight=False)
    failed = [job_label(r.job) for r in results if r.failed_entirely]
    if failed:
        console.print(f"[red]no config could be measured for: {', '.join(failed)}[/red]")
        raise SystemExit(1)  # typer.Exit is swallowed by main()'s standalone_mode=False


def tune(
    kernel: Annotated[str, typer.Option("--kernel", help="kernel family, e.g. ag_gemm")],
    shape: Annotated[str, typer.Option("--shape", help="e.g. 8192x4096x12288 or M=8192,N=4096,K=12288")],
    dtype: Annotated[str, typer.Option(help="bf16, fp16 or fp32")] = "bf16",
    world_size: Annotated[int, typer.Option("--world-size", help="ranks of the kernel")] = 2,
    trials: Annotated[int, typer.Option(help="trial budget (configs measured)")] = 64,
    time_budget: Annotated[float | None, typer.Option("--time-budget", help="seconds of trial time")] = None,
    patience: Annotated[int | None, typer.Option(help="stop after this many trials without improvement")] = None,
    strategy: Annotated[str, typer.Option(help="tpe, random or exhaustive")] = "tpe",
    seed: Annotated[int, typer.Option(help="sampler seed")] = 0,
    warmup: Annotated[int | None, typer.Option(help="untimed runs per trial")] = None,
    iters: Annotated[int | None, typer.Option(help="timed runs per trial")] = None,
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    groups: Annotated[int | None, typer.Option(help="tuning groups on this node (default: all GPUs)")] = None,
    report: Annotated[Path | None, typer.Option(help="directory for tuning-curve PNGs and results.json")] = None,
    restrict: Annotated[
        list[str] | None,
        typer.Option("--restrict", help="search a sub-space: NAME=V1,V2 (repeatable), e.g. BLOCK_K=64 mode=ce,push"),
    ] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="module to import first (plug-in family)")
    ] = None,
) -> None:
    """Tune one kernel for one shape on this node."""
    from jointtune.autotune.handles import study_space
    from jointtune.autotune.results import job_label
    from jointtune.autotune.runner import prepare_interpreter, run_jobs
    from jointtune.autotune.search import check_exhaustive
    from jointtune.autotune.settings import Job, TuneSettings
    from jointtune.kernels import get_family

    prepare_interpreter()
    _import_all(imports or [])
    changes = {"warmup": warmup, "iters": iters}
    settings = TuneSettings(
        trials=trials,
        time_budget_s=time_budget,
        patience=patience,
        strategy=strategy,
        seed=seed,
        restrict=parse_restrictions(restrict or []),
    ).replace(**{k: v for k, v in changes.items() if v is not None})
    family = get_family(kernel)
    space = study_space(family, settings)
    problem = space.make_problem(shape, dtype=dtype, world_size=world_size)
    check_exhaustive(space, problem, settings)
    job = Job.of(family.name, problem, settings)
    console = _console()
    title = f"tune {job_label(job)}"
    options = _options(None, None)
    results = run_jobs(
        [job], url=db, imports=imports or [], groups=groups, console=console, options=options, title=title
    )
    _finish(results, report, console)


def sweep(
    file: Annotated[Path, typer.Argument(help="sweep YAML file (see examples/sweep.yaml)")],
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    profile: Annotated[str, typer.Option(help="auto (gpu when CUDA is visible), gpu or cpu")] = "auto",
    groups: Annotated[int | None, typer.Option(help="tuning groups on this node (default: all GPUs)")] = None,
    report: Annotated[Path | None, typer.Option(help="directory for tuning-curve PNGs and results.json")] = None,
    register_only: Annotated[bool, typer.Option("--register-only", help="only register it for workers")] = False,
) -> None:
    """Tune every job of a sweep file's profile on this node (and register it for workers)."""
    from jointtune.autotune.registry import register_sweep
    from jointtune.autotune.runner import prepare_interpreter, run_jobs
    from jointtune.autotune.studies import open_storage
    from jointtune.autotune.sweepfile import load_sweep_file
    from jointtune.db import open_store, resolve_db_url

    on_gpu = prepare_interpreter()
    spec = load_sweep_file(file)
    chosen = ("gpu" if on_gpu else "cpu") if profile == "auto" else profile
    jobs = spec.jobs(chosen)
    url = resolve_db_url(db)
    open_store(url)
    register_sweep(open_storage(url), spec.name, spec.profiles, imports=spec.imports)
    console = _console()
    if register_only:
        console.print(f"registered sweep {spec.name!r}: {sum(map(len, spec.profiles.values()))} jobs", highlight=False)
        return
    title = f"sweep {spec.name} ({chosen}, {len(jobs)} shapes)"
    options = _options(None, None)
    results = run_jobs(
        jobs, url=url, imports=spec.imports, groups=groups, console=console, options=options, title=title
    )
    _finish(results, report, console)


def worker(
    storage: Annotated[str, typer.Option("--storage", help="database URL the sweep is registered in")],
    sweep_name: Annotated[str, typer.Option("--sweep", help="name of a registered sweep")],
    profile: Annotated[str, typer.Option(help="auto (gpu when CUDA is visible), gpu or cpu")] = "auto",
    groups: Annotated[int | None, typer.Option(help="groups to launch (without torchrun)")] = None,
    heartbeat: Annotated[int | None, typer.Option(help="seconds between trial heartbeats")] = None,
    grace: Annotated[int | None, typer.Option(help="seconds without a heartbeat before a trial is stale")] = None,
) -> None:
    """Work on a registered sweep until none of its studies has work left."""
    from jointtune.autotune.registry import load_sweep
    from jointtune.autotune.runner import prepare_interpreter, run_jobs
    from jointtune.autotune.studies import open_storage
    from jointtune.db import open_store, resolve_db_url

    on_gpu = prepare_interpreter()
    url = resolve_db_url(storage)
    open_store(url)
    registered = load_sweep(open_storage(url), sweep_name)
    chosen = ("gpu" if on_gpu else "cpu") if profile == "auto" else profile
    jobs = registered.jobs(chosen)
    _import_all(list(registered.imports))
    options = _options(heartbeat, grace)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import logging

        from jointtune.autotune.group import GroupSpec, run_rank

        # No live table under torchrun: rank 0 logs each trial instead.
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("jointtune.autotune.coordinator").setLevel(logging.INFO)
        from jointtune.autotune.recovery import host_id

        spec = GroupSpec(
            url=url,
            group_id=f"torchrun:{host_id()}:{os.environ['TORCHELASTIC_RUN_ID']}",
            sweep=sweep_name,
            profile=chosen,
            world_kind="cuda" if on_gpu else "local",
            nprocs=int(os.environ.get("WORLD_SIZE", "1")),
            imports=registered.imports,
            options=options,
        )
        raise SystemExit(run_rank(spec))
    console = _console()
    title = f"worker {sweep_name} ({chosen})"
    results = run_jobs(
        jobs, url=url, imports=registered.imports, groups=groups, console=console, options=options,
        sweep=sweep_name, profile=chosen, title=title,
    )  # fmt: skip
    _finish(results, None, console)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
    app.command("sweep")(sweep)
    app.command("worker")(worker)
