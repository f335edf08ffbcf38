"""`jointtune db ...`: migrate, inspect and list the tuning store.

Every command takes `--db URL` (default: $JOINTTUNE_DB_URL, then the per-user SQLite file). A bad
or unreachable URL is a StoreError, which `jointtune.cli.main` prints as one line with exit 2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from jointtune.search_spaces import Space

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="SQLAlchemy URL (sqlite:///PATH or postgresql+psycopg://...); "
        "default: $JOINTTUNE_DB_URL, then ~/.local/share/jointtune/jointtune.db",
        show_default=False,
    ),
]

db_app = typer.Typer(no_args_is_help=True, help="Migrate, inspect and list the tuning store.")


@db_app.command("upgrade")
def upgrade_command(db: DbOption = None) -> None:
    """Create or migrate the store's tables to the newest schema (safe to run repeatedly)."""
    from jointtune.db import Store

    with Store(db, migrate=False) as store:
        result = store.upgrade()
        if result.changed:
            typer.echo(f"{store.display_url}: upgraded {result.before or 'empty'} -> {result.after}")
        else:
            typer.echo(f"{store.display_url}: already at {result.after} (head)")


@db_app.command("info")
def info_command(db: DbOption = None) -> None:
    """Show the URL (password hidden), backend, schema revision and how much the store holds."""
    from jointtune._command import jointtune_command
    from jointtune.cli._checks import existing_store_url
    from jointtune.db import Store

    with Store(existing_store_url(db), migrate=False) as store:
        revision, head = store.revision(), store.head_revision()
        upgrade = f"{jointtune_command()} db upgrade" + ("" if db is None else f" --db {store.display_url}")
        typer.echo(f"url:      {store.display_url}")
        typer.echo(f"backend:  {store.backend}")
        if revision is None:
            typer.echo(f"revision: none (empty; head is {head}, applied on first use or by `{upgrade}`)")
            return
        state = "head" if revision == head else f"behind head {head}; run `{upgrade}`"
        typer.echo(f"revision: {revision} ({state})")
        if revision == head:
            typer.echo(f"records:  {store.count_records()}")
            typer.echo(f"kernels:  {len(store.list_kernels())}")
            typer.echo(f"hardware: {len(store.list_hardware())}")


@db_app.command("list")
def list_command(
    db: DbOption = None,
    kernel: Annotated[str | None, typer.Option(help="only this kernel")] = None,
    hardware: Annotated[str | None, typer.Option(help="only this hardware id")] = None,
    dtype: Annotated[str | None, typer.Option(help="only this dtype")] = None,
    world_size: Annotated[int | None, typer.Option(help="only this world size")] = None,
    timing: Annotated[str | None, typer.Option(help="only this timing policy (gpu, eager, graph, interp)")] = None,
    limit: Annotated[int, typer.Option(help="rows to show")] = 50,
    offset: Annotated[int, typer.Option(help="rows to skip", min=0, max=2**31 - 1)] = 0,
) -> None:
    """Show stored records as a table: the best config per key, with its latency, speed-up and its study's trial
    count (the record's own `trials`, as REST, bundles and the dashboard show it)."""
    from rich.console import Console
    from rich.table import Table

    from jointtune.cli._checks import existing_store_url
    from jointtune.db import RecordKey, Store
    from jointtune.errors import UnknownNameError

    where = RecordKey.any(kernel=kernel, hardware_id=hardware, dtype=dtype, world_size=world_size, timing=timing)
    with Store(existing_store_url(db)) as store:
        if kernel is not None and not store.list_kernels(name=kernel):  # a typo shows no empty table
            stored = sorted({k.name for k in store.list_kernels()})
            raise UnknownNameError(f"--kernel: {kernel!r} has no records in this store; stored kernels: {stored}")
        records = store.list_records(where, limit=limit, offset=offset)
        total = store.count_records(where)
    table = Table(title=f"{store.display_url}: {len(records)} of {total} records", title_justify="left")
    columns = ("id", "kernel", "kernel version", "shape", "dtype", "ws", "timing", "hardware", "p50 µs", "speedup",
               "trials", "config")  # fmt: skip
    for name in columns:
        table.add_column(name, justify="right" if name in {"id", "ws", "p50 µs", "speedup", "trials"} else "left",
                         min_width=24 if name == "config" else None)  # fmt: skip
    for rec in records:
        table.add_row(
            str(rec.id),
            rec.kernel,
            rec.kernel_version[:12],
            shape_text(rec.kernel, rec.shape),
            rec.dtype,
            str(rec.world_size),
            rec.timing,
            rec.hardware_id,
            f"{rec.latency_p50_us:.1f}",
            "-" if rec.speedup is None else f"{rec.speedup:.2f}x",
            str(rec.trials),
            config_text(rec.kernel, rec.config),  # wraps between fields
        )
    console = Console()
    if not console.is_terminal:  # piped: don't squeeze the table into 80 columns
        console = Console(width=200)
    console.print(table)


def _in_space_order(
    kernel: str, values: dict[str, Any], names_of: Callable[[Space], Sequence[str]], fallback: Sequence[str]
) -> list[str]:
    """`values`' names in the order `names_of` the kernel's space gives, then the rest by name; `fallback` first
    where the space is not registered in this process."""
    from jointtune.errors import UnknownNameError
    from jointtune.search_spaces import get_space

    try:
        known = names_of(get_space(kernel))
    except UnknownNameError:
        known = fallback
    order = [name for name in known if name in values]
    return order + sorted(name for name in values if name not in order)


def shape_text(kernel: str, shape: dict[str, int]) -> str:
    """Dims in the order of the kernel's space (M, N, K for the GEMM families), as everywhere else."""
    return ",".join(f"{d}={shape[d]}" for d in _in_space_order(kernel, shape, lambda s: s.dims, ("M", "N", "K")))


def config_text(kernel: str, config: dict[str, Any]) -> str:
    """Fields in the order of the kernel's space (mode first): the same text on every backend (PostgreSQL's JSON
    reorders keys)."""
    return " ".join(
        f"{name}={config[name]}" for name in _in_space_order(kernel, config, lambda s: [p.name for p in s.params], ())
    )


def register(app: typer.Typer) -> None:
    """Add the `db` command group to the jointtune app."""
    app.add_typer(db_app, name="db")
