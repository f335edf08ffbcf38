"""`jointtune tune`, `jointtune sweep` and `jointtune worker`: offline tuning from the command line.

- `tune`: one (kernel, shape) now, on this node.
- `sweep FILE`: register a sweep file's jobs in the storage and tune this node's profile of them.
- `worker --storage URL --sweep NAME`: join a registered sweep; under `torchrun
  --nproc-per-node=<GPUs>` this process is one rank of the node's group, otherwise it launches
  its own groups. Groups on many nodes share the sweep's studies through the storage.

All three check every path and option first (bad input: one line naming the field, exit 2, before
any work), print a header (what runs, the profile, the database, shapes already tuned), live
progress, then the tuned table and a summary with the next commands (`_summary`); they exit 1 when
a shape could not be tuned at all (every trial failed).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from jointtune.autotune.workers import phases
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from jointtune.autotune.tuner.results import JobResult
    from jointtune.autotune.tuner.settings import Job, TuneSettings
    from jointtune.autotune.workers.coordinator import GroupOptions
    from jointtune.autotune.workers.warm import WarmRanks

_DB_HELP = "database URL of the store and the Optuna studies (default: $JOINTTUNE_DB_URL or the per-user SQLite file)"


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise TuningError(f"{name}: {text[:40]!r} is not allowed; give whole seconds (e.g. {default})")
    return int(text)


def _options(heartbeat: int | None, grace: int | None) -> GroupOptions:
    """Heartbeat and grace from the options, else $JOINTTUNE_HEARTBEAT_S / $JOINTTUNE_GRACE_S."""
    from jointtune.autotune.tuner.settings import MAX_SECONDS
    from jointtune.autotune.workers.coordinator import GroupOptions

    defaults = GroupOptions()
    beat = heartbeat if heartbeat is not None else _env_int("JOINTTUNE_HEARTBEAT_S", defaults.heartbeat_s)
    grace_s = grace if grace is not None else _env_int("JOINTTUNE_GRACE_S", defaults.grace_s)
    if not 1 <= beat < grace_s <= MAX_SECONDS:
        raise TuningError(
            f"heartbeat/grace: {beat}/{grace_s} s is not allowed; need heartbeat >= 1, grace > heartbeat and "
            f"grace <= {MAX_SECONDS:.0f}"
        )
    return GroupOptions(heartbeat_s=beat, grace_s=grace_s)


def _import_all(modules: list[str]) -> None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a bad name (ValueError, TypeError) or a module that fails as it loads
            raise TuningError(f"--import: {module!r} can't be imported ({type(exc).__name__}: {exc})") from None


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


def _entered() -> None:
    """Note where this process's start ends (interpreter and imports) in the phases log ($JOINTTUNE_PHASES)."""
    phases.set_who("cli")
    phases.record_start()


def _console() -> Console:
    # Logs (CI, `| tee`) get wide lines instead of rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=200)


GroupsOption = Annotated[
    int | None, typer.Option(min=1, help="tuning groups on this node (default: all GPUs; one on the CPU)")
]
ReportOption = Annotated[
    str | None,
    typer.Option(help="directory for tuning-curve PNGs and results.json (made and checked before tuning starts)"),
]
ProfileOption = Annotated[str, typer.Option(help="auto (gpu when CUDA is visible), gpu or cpu")]


def _tune_and_summarise(
    jobs: Sequence[Job],
    *,
    what: str,
    url: str,
    imports: Sequence[str],
    groups: int | None,
    options: GroupOptions,
    report: Path | None,
    report_hint: str | None,
    profile: str | None = None,
    sweep_name: str | None = None,
    epilogue: Callable[[Sequence[JobResult]], None] | None = None,
    warm: WarmRanks | None = None,
) -> None:
    """Header, live progress, tuned table and closing summary around one `run_jobs` (then `epilogue(results)`, also
    when the summary exits 1 for a shape that could not be tuned). `warm`: rank processes started already."""
    from jointtune.autotune.workers.runner import run_jobs
    from jointtune.cli._summary import print_header, print_interrupted, print_summary
    from jointtune.hardware import detect

    console = _console()
    hardware_id = detect().hardware_id
    phases.lap("hardware")
    jobs = _distinct(jobs, hardware_id)
    already: list[str] = []

    def on_start(results: Sequence[JobResult], parallel: int) -> None:
        already.extend(r.study_name for r in results if r.done_reason is not None)
        print_header(console, what=what, profile=profile, url=url, hardware_id=hardware_id, results=results,
                     groups=parallel)  # fmt: skip

    start = time.monotonic()
    try:
        results = run_jobs(
            jobs, url=url, imports=imports, groups=groups, console=console, options=options, sweep=sweep_name,
            profile=profile if sweep_name else None, title=what, on_start=on_start, warm=warm,
        )  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C: the groups are stopped; say what is kept and how to go on
        from jointtune.autotune.tuner.results import collect
        from jointtune.autotune.tuner.studies import open_storage

        done = collect(open_storage(url), jobs, hardware_id=hardware_id)
        print_interrupted(console, done, url=url, elapsed_s=time.monotonic() - start, again=this_command())
        raise SystemExit(130) from None
    try:
        with phases.phase("summary"):
            print_summary(
                console, results, url=url, elapsed_s=time.monotonic() - start, already=already, report=report,
                report_hint=report_hint, hardware_id=hardware_id,
            )  # fmt: skip
    finally:
        if epilogue is not None:
            epilogue(results)


def this_command() -> str:
    """The command line this process runs, as the caller's shell can run it again."""
    from jointtune._command import jointtune_command

    return " ".join([jointtune_command(), *map(shlex.quote, sys.argv[1:])])


def _distinct(jobs: Sequence[Job], hardware_id: str) -> list[Job]:
    """The jobs with a study of their own here: on the CPU interpreter a sweep's gpu and eager jobs of one shape
    measure the same thing (interp) in one study, so the first of them stands for both."""
    import dataclasses

    from jointtune.timings import measured_as

    seen: set[Job] = set()
    out = []
    for job in jobs:
        measured = job.settings.replace(timing=measured_as(job.settings.timing, hardware_id))
        same = dataclasses.replace(job, settings=measured)
        if same not in seen:
            seen.add(same)
            out.append(job)
    return out


def tune(
    kernel: Annotated[str | None, typer.Option("--kernel", help="kernel family, e.g. ag_gemm")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="e.g. 8192x4096x12288 or M=8192,N=4096,K=12288")] = None,
    dtype: Annotated[str, typer.Option(help="bf16 or fp16 (what every kernel family runs)")] = "bf16",
    world_size: Annotated[int, typer.Option("--world-size", min=1, help="ranks of the kernel")] = 2,
    trials: Annotated[int, typer.Option(help="trial budget (configs measured)")] = 64,
    time_budget: Annotated[float | None, typer.Option("--time-budget", help="seconds of trial time")] = None,
    patience: Annotated[int | None, typer.Option(help="stop after this many trials without improvement")] = None,
    strategy: Annotated[str, typer.Option(help="tpe, random or exhaustive")] = "tpe",
    timing: Annotated[
        str,
        typer.Option(
            help="how trials are timed: gpu (GPU time behind a hold), eager (wall time of calls back to back, "
            "host included) or graph (replays of a captured CUDA graph; needs a GPU); without a GPU every policy "
            "times the CPU interpreter's wall time, recorded as interp"
        ),
    ] = "gpu",
    seed: Annotated[int, typer.Option(help="sampler seed", min=0, max=2**32 - 1)] = 0,
    warmup: Annotated[int | None, typer.Option(help="untimed runs per trial")] = None,
    iters: Annotated[int | None, typer.Option(help="timed runs per trial")] = None,
    final_rounds: Annotated[
        int | None,
        typer.Option(
            "--final-rounds",
            help="once the trials are done, time the configs within 3% of the fastest again side by side this "
            "many rounds and keep the lowest median (default 5; 0: keep the fastest trial)",
        ),
    ] = None,
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    groups: GroupsOption = None,
    report: ReportOption = None,
    restrict: Annotated[
        list[str] | None,
        typer.Option(
            "--restrict",
            help="search a sub-space: NAME=V1,V2, once per param, e.g. --restrict BLOCK_K=64 --restrict mode=ce,push",
        ),
    ] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="module to import first (plug-in family)")
    ] = None,
    allow_nondeterministic: Annotated[
        bool,
        typer.Option(
            "--allow-nondeterministic",
            help="also search modes whose results may differ in the last bits between identical calls "
            "(e.g. gemm_rs mode=atomic); off by default",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="instead of --kernel/--shape: every fused-op shape of this model's decoder layer; an HF config.json "
            "(file or directory) or a shipped name (llama-3-8b, llama-3-70b, qwen2.5-32b, mixtral-8x7b)",
        ),
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="tensor-parallel degree of --model")] = None,
    tokens: Annotated[
        str | None, typer.Option("--tokens", help="--model: token counts of a step, e.g. 1,8,32,4096")
    ] = None,
    kv_lens: Annotated[
        str | None, typer.Option("--kv-lens", help="--model: KV lengths of decode attention, e.g. 4096,32768")
    ] = None,
    attention: Annotated[
        str,
        typer.Option(
            help="--model: decode attention to tune: head (the layer's, per rank), context (KV split by "
            "sequence over the ranks) or both"
        ),
    ] = "head",
    decode_max: Annotated[
        int, typer.Option("--decode-max", min=1, help="--model: token counts up to this are decode batches too")
    ] = 256,
    export: Annotated[
        str | None, typer.Option("--export", help="--model: write the tuned records of its shapes to this bundle")
    ] = None,
) -> None:
    """Tune one kernel for one shape on this node, or (--model) every fused-op shape of a model."""
    args = dict(locals())
    _entered()
    from jointtune.autotune.tuner.settings import TuneSettings

    changes = {"warmup": warmup, "iters": iters, "final_rounds": final_rounds}
    try:
        settings = TuneSettings(
            trials=trials,
            time_budget_s=time_budget,
            patience=patience,
            strategy=strategy,
            seed=seed,
            restrict=parse_restrictions(restrict or []),
            timing=timing,
            allow_nondeterministic=allow_nondeterministic,
        ).replace(**{k: v for k, v in changes.items() if v is not None})
    except TuningError as exc:  # name the option the user typed, not the setting behind it
        text = str(exc)
        field = text.split(":", 1)[0]
        if field.isidentifier() and not field.startswith("restrict"):
            text = "--" + field.removesuffix("_s").replace("_", "-") + text[len(field) :]
        raise TuningError(text) from None
    options = _options(None, None)
    warm = None
    if model is None and kernel is not None and shape is not None:
        from jointtune.autotune.workers.warm import WarmRanks, expected_ranks

        # the rank processes import while this one reads torch, checks the job, opens the store, reads the hardware
        warm = WarmRanks(expected_ranks(world_size=world_size, groups=groups))
    try:
        _tune(**args, settings=settings, options=options, warm=warm)
    finally:
        if warm is not None:
            warm.close()


def _tune(
    *,
    kernel: str | None,
    shape: str | None,
    dtype: str,
    world_size: int,
    trials: int,
    time_budget: float | None,
    patience: int | None,
    strategy: str,
    timing: str,
    seed: int,
    warmup: int | None,
    iters: int | None,
    final_rounds: int | None,
    db: str | None,
    groups: int | None,
    report: str | None,
    restrict: list[str] | None,
    imports: list[str] | None,
    allow_nondeterministic: bool,
    model: str | None,
    tp: int | None,
    tokens: str | None,
    kv_lens: str | None,
    attention: str,
    decode_max: int,
    export: str | None,
    settings: TuneSettings,
    options: GroupOptions,
    warm: WarmRanks | None,
) -> None:
    """`tune`'s work once its options are read (`warm`: rank processes started already, for `_tune_and_summarise`)."""
    from jointtune.autotune.tuner.handles import study_space
    from jointtune.autotune.tuner.results import job_label
    from jointtune.autotune.tuner.search import check_study
    from jointtune.autotune.tuner.settings import Job
    from jointtune.autotune.workers.runner import prepare_interpreter
    from jointtune.cli._checks import prepare_report_dir
    from jointtune.cli.db import shape_text
    from jointtune.db import open_store, resolve_db_url
    from jointtune.kernels import get_family

    url = resolve_db_url(db)
    on_gpu = prepare_interpreter()
    phases.lap("torch")
    if not on_gpu and timing == "graph":
        raise TuningError(
            "--timing: 'graph' needs CUDA graphs, and no GPU is visible here; allowed here: gpu, eager, interp "
            "(each times the CPU interpreter's wall time, recorded as interp)"
        )
    if on_gpu and timing == "interp":
        raise TuningError("--timing: 'interp' is the CPU interpreter's wall time, and a GPU runs the kernels here; "
                          "allowed here: gpu, eager, graph")  # fmt: skip
    _import_all(imports or [])
    if model is not None:
        _tune_model(model, kernel=kernel, shape=shape, restrict=restrict, tp=tp, tokens=tokens, kv_lens=kv_lens,
                    attention=attention, decode_max=decode_max, dtype=dtype, settings=settings, url=url,
                    imports=imports or [], groups=groups, options=options, report=report, export=export)  # fmt: skip
        return
    model_only = [name for name, given in (("--tp", tp), ("--tokens", tokens), ("--kv-lens", kv_lens),
                                           ("--export", export)) if given is not None]  # fmt: skip
    if kernel is None or shape is None or model_only:
        extra = f"; {', '.join(model_only)} only with --model" if model_only else ""
        raise TuningError(f"--kernel and --shape: give both (one shape), or --model CONFIG (a model's shapes){extra}")
    family = get_family(kernel)
    space = study_space(family, settings)
    asked = space.make_problem(shape, dtype=dtype, world_size=world_size)
    problem = family.stored_problem(asked)
    if problem != asked:
        tuned, typed = shape_text(family.name, problem.dims), shape_text(family.name, asked.dims)
        Console(stderr=True).print(f"{family.name}: tuning {tuned}, the key calls of {typed} look up")
    check_study(space, problem, settings)
    job = Job.of(family.name, problem, settings)
    report = prepare_report_dir(report)
    phases.lap("job")
    open_store(url)  # reachable and migrated, before any work
    phases.lap("store")
    _tune_and_summarise(
        [job], what=f"jointtune tune {job_label(job)}", url=url, imports=imports or [], groups=groups,
        options=options, report=report, report_hint=f"{this_command()} --report DIR", warm=warm,
    )  # fmt: skip


def _tune_model(model: str, *, kernel: str | None, shape: str | None, restrict: list[str] | None, tp: int | None,
                tokens: str | None, kv_lens: str | None, attention: str, decode_max: int, dtype: str,
                settings: TuneSettings, url: str, imports: list[str], groups: int | None, options: GroupOptions,
                report: str | None, export: str | None) -> None:  # fmt: skip
    """`tune --model`: the model's shapes as one sweep, then its per-layer table and, with --export, the bundle."""
    from jointtune.cli._checks import prepare_report_dir
    from jointtune.cli._model import check_export_path, describe, model_epilogue, plan_from_options
    from jointtune.db import open_store

    given = [name for name, value in (("--kernel", kernel), ("--shape", shape), ("--restrict", restrict)) if value]
    if given:
        raise TuningError(f"{', '.join(given)}: not allowed with --model (it tunes every shape of the model's layer)")
    plan = plan_from_options(model, tp=tp, tokens=tokens, kv_lens=kv_lens, attention=attention,
                             decode_max=decode_max, dtype=dtype, settings=settings)  # fmt: skip
    export_path = check_export_path(export)
    report_dir = prepare_report_dir(report)
    open_store(url)
    _tune_and_summarise(
        plan.jobs, what=describe(plan), url=url, imports=imports, groups=groups, options=options, report=report_dir,
        report_hint=f"{this_command()} --report DIR",
        epilogue=model_epilogue([plan], url=url, export=export_path, console=_console()),
    )  # fmt: skip


def sweep(
    file: Annotated[Path, typer.Argument(help="sweep YAML file (see examples/sweep.yaml)")],
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    profile: ProfileOption = "auto",
    groups: GroupsOption = None,
    report: ReportOption = None,
    register_only: Annotated[bool, typer.Option("--register-only", help="only register it for workers")] = False,
) -> None:
    """Tune every job of a sweep file's profile on this node (and register it for workers)."""
    _entered()
    from jointtune._command import jointtune_command
    from jointtune.autotune.tuner.studies import open_storage
    from jointtune.autotune.workers.runner import prepare_interpreter
    from jointtune.autotune.workers.sweeps.registry import register_sweep
    from jointtune.autotune.workers.sweeps.sweepfile import load_sweep_file
    from jointtune.cli._checks import check_profile, prepare_report_dir
    from jointtune.db import open_store, redact_url, resolve_db_url

    url = resolve_db_url(db)
    options = _options(None, None)
    on_gpu = prepare_interpreter()
    chosen = check_profile(profile, on_gpu=on_gpu)
    spec = load_sweep_file(file)
    jobs = spec.jobs(chosen)
    report = prepare_report_dir(report)
    open_store(url)
    register_sweep(open_storage(url), spec.name, spec.profiles, imports=spec.imports)
    if register_only:
        count = sum(map(len, spec.profiles.values()))
        _console().print(f"registered sweep {spec.name!r}: {count} jobs", markup=False, highlight=False)
        return
    again = f"{jointtune_command()} sweep {shlex.quote(str(file))}"
    again += ("" if db is None else f" --db {redact_url(url)}") + " --report DIR"
    plans = spec.models.get(chosen, ())
    epilogue = None
    if plans:
        from jointtune.cli._model import model_epilogue

        epilogue = model_epilogue(plans, url=url, export=None, console=_console())
    _tune_and_summarise(
        jobs, what=f"jointtune sweep {spec.name}", url=url, imports=spec.imports, groups=groups, options=options,
        report=report, report_hint=again, profile=chosen, epilogue=epilogue,
    )  # fmt: skip


def worker(
    storage: Annotated[str, typer.Option("--storage", help="database URL the sweep is registered in")],
    sweep_name: Annotated[str, typer.Option("--sweep", help="name of a registered sweep")],
    profile: ProfileOption = "auto",
    groups: Annotated[int | None, typer.Option(min=1, help="groups to launch (without torchrun)")] = None,
    heartbeat: Annotated[int | None, typer.Option(help="seconds between trial heartbeats")] = None,
    grace: Annotated[int | None, typer.Option(help="seconds without a heartbeat before a trial is stale")] = None,
) -> None:
    """Work on a registered sweep until none of its studies has work left."""
    from jointtune.autotune.tuner.studies import open_storage
    from jointtune.autotune.workers.runner import prepare_interpreter
    from jointtune.autotune.workers.sweeps.registry import load_sweep
    from jointtune.cli._checks import check_profile, existing_store_url
    from jointtune.db import open_store

    options = _options(heartbeat, grace)
    url = existing_store_url(storage, option="--storage")  # a sweep is registered in a store that exists
    on_gpu = prepare_interpreter()
    chosen = check_profile(profile, on_gpu=on_gpu)
    open_store(url)
    registered = load_sweep(open_storage(url), sweep_name)
    jobs = registered.jobs(chosen)
    _import_all(list(registered.imports))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import logging

        from jointtune.autotune.workers.group import GroupSpec, run_rank

        # No live table under torchrun: rank 0 logs each trial instead.
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("jointtune.autotune.workers.coordinator").setLevel(logging.INFO)
        from jointtune.autotune.workers.recovery import host_id

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
    _tune_and_summarise(
        jobs, what=f"jointtune worker {sweep_name}", url=url, imports=registered.imports, groups=groups,
        options=options, report=None, report_hint=None, profile=chosen, sweep_name=sweep_name,
    )  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
    app.command("sweep")(sweep)
    app.command("worker")(worker)
