"""`jointtune spaces ...`: list, show, count and validate the joint search spaces.

Counting is where a space's size gets sanity-checked against real shapes before any GPU time is
spent: `jointtune spaces count --anchors` prints valid configs per mode for the anchor problems.
Device limits come from the hardware module when it can detect a GPU; otherwise (or with
`--nominal`) a nominal Hopper, so counts are the same on CPU-only machines.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from jointtune._command import jointtune_command
from jointtune.errors import JointtuneError, SpaceError
from jointtune.search_spaces import (
    ANCHOR_DTYPE,
    ANCHOR_WORLD_SIZE,
    DeviceLimits,
    Param,
    Problem,
    Space,
    anchor_problems,
    format_choices,
    get_space,
    space_names,
)

spaces_app = typer.Typer(no_args_is_help=True, help="Inspect the joint search spaces: list, show, count, validate.")

Dtype = Annotated[
    str, typer.Option("--dtype", help="bf16 or fp16, the dtypes every kernel family runs (torch names work too).")
]
WorldSize = Annotated[int, typer.Option("--world-size", help="Ranks the problem is split over.")]
Nominal = Annotated[bool, typer.Option("--nominal", help="Use nominal Hopper limits, not the local GPU's.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def resolve_limits(limits: DeviceLimits | None = None, *, nominal: bool = False) -> tuple[DeviceLimits, str]:
    """The limits to count against and where they came from: given, detected, or nominal Hopper."""
    if limits is not None:
        return limits, "given limits"
    if not nominal:
        try:
            from jointtune.hardware import current_limits
        except ImportError:
            pass
        else:
            try:
                found = current_limits()
            except JointtuneError:
                pass
            else:
                return found, "nominal Hopper (no GPU)" if found.interpreter else "this device"
    return DeviceLimits.nominal_hopper(), "nominal Hopper"


def _describe(limits: DeviceLimits, source: str) -> str:
    return f"{source}: max_shared_mem={limits.max_shared_mem} B, num_sms={limits.num_sms}"


def anchor_counts(limits: DeviceLimits | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Valid-config counts (total and per mode) for every anchor problem of the named spaces."""
    limits = limits if limits is not None else resolve_limits()[0]
    return [_count_row(space, problem, limits) for space, problem in anchor_problems(names)]


def _count_row(space: Space, problem: Problem, limits: DeviceLimits) -> dict[str, Any]:
    modes = space.count_by_mode(problem, limits)
    total = sum(modes.values()) if modes else space.count(problem, limits)
    return {
        "space": space.name,
        "version": space.version,
        "shape": problem.dims,
        "dtype": problem.dtype,
        "world_size": problem.world_size,
        "total": total,
        "modes": modes,
    }


def _problem(space: Space, shape: str | None, dtype: str, world_size: int) -> Problem:
    if shape is None:
        raise SpaceError(
            f"--shape: missing for space {space.name!r}; write {'x'.join(space.dims)} (e.g. {space.example}) "
            f"or name=value pairs"
        )
    return space.make_problem(shape, dtype=dtype, world_size=world_size)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def kernels_by_space() -> dict[str, list[str]]:
    """Space name -> the kernel families that run it, from the family registry (a space without
    one can be counted and validated, not yet tuned or run). Loading the registry imports the
    built-in kernel modules (Triton), so only `list` and `show` ask it."""
    from jointtune.kernels import family_names, get_family

    out: dict[str, list[str]] = {}
    for name in family_names():
        space = get_family(name).space
        out.setdefault(space if isinstance(space, str) else space.name, []).append(name)
    return out


@spaces_app.command("list")
def list_spaces(as_json: AsJson = False) -> None:
    """Every registered space with its version, dims, number of params and its kernel, if it has one."""
    kernels = kernels_by_space()
    rows = [
        {
            "name": s.name,
            "version": s.version,
            "revision": s.revision,
            "dims": list(s.dims),
            "params": len(s.params),
            "kernels": kernels.get(s.name, []),
        }
        for s in map(get_space, space_names())
    ]
    if as_json:
        _print_json(rows)
        return
    table = Table(
        "space", "space version", "revision", "dims", "params", "constraints", "kernel", title="search spaces",
        caption="kernel: the family that runs the space; without one a space can be counted and validated, not tuned",
    )  # fmt: skip
    for row in rows:
        n_rules = len(get_space(row["name"]).constraints)
        table.add_row(
            row["name"],
            row["version"],
            str(row["revision"]),
            "x".join(row["dims"]),
            str(row["params"]),
            str(n_rules),
            ", ".join(row["kernels"]) or "none yet",
        )
    _print_table(table)


@spaces_app.command("show")
def show(name: Annotated[str, typer.Argument(help="Space name.")], as_json: AsJson = False) -> None:
    """A space's params (choices and conditions), constraints, and which kernel runs it."""
    space = get_space(name)
    if as_json:
        _print_json(space.to_json())
        return
    console = Console()
    console.print(
        f"[bold]{space.name}[/bold]  space version {space.version}  revision {space.revision}  "
        f"dims {'x'.join(space.dims)}"
    )
    kernels = kernels_by_space().get(space.name, [])
    if kernels:
        tune = f"{jointtune_command()} tune --kernel {kernels[0]} ..."
        console.print(
            f"kernel: {', '.join(kernels)} (tune it with `{tune}`)", markup=False, highlight=False, soft_wrap=True
        )
    else:
        console.print("kernel: none yet; the space can be counted and validated, not tuned or run", markup=False)
    if space.doc:
        console.print(space.doc)
    params = Table("param", "choices", "exists when", "meaning", title="params")
    for p in space.params:
        params.add_row(p.name, _choices(p), p.when.describe() if p.when else "always", p.doc)
    rules = Table("constraint", "fields", "rule", title="constraints")
    for c in space.constraints:
        rules.add_row(c.name, ", ".join(c.fields), c.rule)
    console.print(params)
    console.print(rules)


def _print_table(table: Table) -> None:
    """On a terminal as wide as the terminal; piped (a log, a test), as wide as the table needs, so every row stays
    on one line whatever the number of modes."""
    console = Console()
    if not console.is_terminal:
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        console = Console(width=max(console.width, natural))
    console.print(table)


def _choices(p: Param) -> str:
    if p.kind == "pow2" and len(p.choices) > 2:
        return f"pow2 {p.choices[0]}..{p.choices[-1]}"
    return format_choices(p.choices)


@spaces_app.command("count")
def count(
    name: Annotated[str | None, typer.Argument(help="Space name (optional with --anchors).")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="8192x4096x12288 or M=8192,N=4096,K=12288.")] = None,
    dtype: Dtype = "bf16",
    world_size: WorldSize = 2,
    anchors: Annotated[bool, typer.Option("--anchors", help="Count every anchor problem instead.")] = False,
    nominal: Nominal = False,
    as_json: AsJson = False,
) -> None:
    """Valid configs of one problem (or of the anchor problems), in total and per mode."""
    limits, source = resolve_limits(nominal=nominal)
    if anchors:
        if shape is not None:
            raise SpaceError("--shape: not allowed with --anchors; the anchor shapes are fixed")
        rows = anchor_counts(limits, [get_space(name).name] if name else None)
        title = f"valid configs at the anchors ({ANCHOR_DTYPE}, world size {ANCHOR_WORLD_SIZE})"
    else:
        if name is None:
            raise SpaceError(f"space: missing; give one of {', '.join(space_names())}, or --anchors")
        space = get_space(name)
        rows = [_count_row(space, _problem(space, shape, dtype, world_size), limits)]
        title = f"valid configs ({rows[0]['dtype']}, world size {world_size})"
    if as_json:
        _print_json({"limits": _describe(limits, source), "counts": rows})
        return
    modes: list[str] = []
    for row in rows:
        modes += [m for m in row["modes"] if m not in modes]
    table = Table(title=title, caption=_describe(limits, source), padding=(0, 1), pad_edge=False)
    for name in ("space", "shape", "total", *modes):  # counts and names fold, never end in "…"
        table.add_column(name, overflow="fold")
    for row in rows:
        per_mode = [str(row["modes"][m]) if m in row["modes"] else "-" for m in modes]
        table.add_row(row["space"], "x".join(str(v) for v in _ordered(row)), str(row["total"]), *per_mode)
    _print_table(table)


def _ordered(row: dict[str, Any]) -> list[int]:
    return [row["shape"][d] for d in get_space(row["space"]).dims]


@spaces_app.command("validate")
def validate(
    name: Annotated[str, typer.Argument(help="Space name.")],
    shape: Annotated[str | None, typer.Option("--shape", help="8192x4096x12288 or M=8192,N=4096,K=12288.")] = None,
    config: Annotated[
        str | None, typer.Option("--config", help='The config as JSON: \'{"mode": "baseline"}\'.')
    ] = None,
    dtype: Dtype = "bf16",
    world_size: WorldSize = 2,
    nominal: Nominal = False,
) -> None:
    """Check one config for a problem; print its canonical JSON and hash, or say what is wrong."""
    space = get_space(name)
    problem = _problem(space, shape, dtype, world_size)
    if config is None:
        raise SpaceError('--config: missing; give the config as JSON, e.g. \'{"mode": "baseline"}\'')
    allowed = 'allowed: a JSON object such as {"mode": "baseline"}'
    try:
        data = json.loads(config)
    except json.JSONDecodeError as exc:
        why = f"{exc.msg} at column {exc.colno}"
        raise SpaceError(f"--config: {config[:200]!r} is not valid JSON ({why}); {allowed}") from None
    except (RecursionError, ValueError) as exc:  # nested past the parser's depth; an int of too many digits
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise SpaceError(f"--config: {config[:60]!r}... can't be read ({why}); {allowed}") from None
    limits, _ = resolve_limits(nominal=nominal)
    canonical = space.validate(data, problem, limits)
    _print_json(
        {
            "space": space.name,
            "version": space.version,
            "config": canonical,
            "hash": space.config_hash(canonical),
        }
    )


def register(app: typer.Typer) -> None:
    app.add_typer(spaces_app, name="spaces")
