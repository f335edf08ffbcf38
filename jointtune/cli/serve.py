"""`jointtune serve`, `jointtune export`, `jointtune import`: run the service, move bundles offline.

Export and import use the same bundle format as `/v1/bundles`. Import validates every file before
writing anything and then writes them in one transaction, so a bad bundle or an interrupted
import leaves the store untouched (a bad file: one-line error naming it and the field, exit 2).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jointtune.errors import JointtuneError, ServiceError

if TYPE_CHECKING:
    from jointtune.server.settings import Settings

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db", help="SQLAlchemy URL; default: $JOINTTUNE_DB_URL, then the per-user SQLite file", show_default=False
    ),
]


class BundleFileError(JointtuneError, ValueError):
    """A bundle file that can't be read or written (names the path and why)."""


def serve_command(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    workers: Annotated[
        int | None,
        typer.Option(
            help="worker processes; default: one per available core, at most 16", min=1, max=64, show_default=False
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Run the config service (uvicorn); migrations are applied before it starts listening."""
    import uvicorn

    from jointtune.db import open_store, resolve_db_url
    from jointtune.server.auth import TokenSet
    from jointtune.server.serving import MAX_DEFAULT_WORKERS, available_cores, default_workers, uvicorn_config

    url = resolve_db_url(db)
    os.environ["JOINTTUNE_DB_URL"] = url  # workers build their app from the environment
    settings = _settings()  # bad JOINTTUNE_* settings fail here, once, not in every worker
    tokens = TokenSet.load(settings.tokens, settings.tokens_file)
    sock = _listen(host, port)  # a host or port we can't have fails before the store is created or migrated
    try:
        store = open_store(url)
        where = store.display_url
        store.close()
    except BaseException:
        sock.close()
        raise
    if workers is None:
        workers = default_workers()
        chosen = f"one per available core ({available_cores()}, at most {MAX_DEFAULT_WORKERS})"
    else:
        chosen = "--workers"
    typer.echo(
        f"jointtune serve: {workers} worker process(es), {chosen}; per worker at most {settings.max_connections} "
        f"connections (JOINTTUNE_MAX_CONNECTIONS; beyond them 503) and {settings.read_timeout_s:g} s to send a "
        "request (JOINTTUNE_READ_TIMEOUT_S)",
        err=True,
    )
    for line in _announcement(host, port, where, writable=len(tokens) > 0):
        typer.echo(line)
    config = uvicorn_config(settings, host=host, port=port, workers=workers)
    if workers == 1:
        uvicorn.Server(config).run(sockets=[sock])
        return
    from uvicorn.supervisors import Multiprocess

    Multiprocess(config, sockets=[sock]).run()


def _announcement(host: str, port: int, store: str, *, writable: bool) -> list[str]:
    """What `serve` says before it starts (beside its workers, on stderr): where to reach it, what it serves, from
    which store."""
    wildcard = host in ("0.0.0.0", "::", "")
    shown = "127.0.0.1" if wildcard else host
    base = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"
    listens = f"{base} (and every other interface of this machine)" if wildcard else base
    writes = "writes need a bearer token (JOINTTUNE_TOKENS)" if writable else (
        "no tokens configured (JOINTTUNE_TOKENS): reads only, publishes and imports are refused"
    )  # fmt: skip
    return [
        f"jointtune serve: listening on {listens}; {writes}",
        f"  store:     {store}",
        f"  dashboard: {base}/dashboard   API docs: {base}/docs   metrics: {base}/metrics",
        f"  ready when {base}/readyz answers; Ctrl-C stops it",
    ]


def _settings() -> Settings:
    """The service's settings from the environment, or one line naming each bad variable."""
    from pydantic import ValidationError

    from jointtune.server.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        bad = "; ".join(
            f"JOINTTUNE_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ServiceError(f"environment: {bad}") from None


def _listen(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn, so a busy port is one line and exit 2 with any worker count. Ours, not
    uvicorn's: its shared socket is made with protocol 0, so asyncio never sets TCP_NODELAY on accepted
    connections and every keep-alive response waits ~40 ms for a delayed ACK (measured: bench/README.md,
    "Config service load")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServiceError(f"--host/--port: can't listen on {host}:{port} ({exc.strerror})") from None
    return sock


def export_command(
    hardware: Annotated[str, typer.Option("--hardware", help="hardware id to export")],
    output: Annotated[Path, typer.Option("-o", "--output", help="bundle file to write")],
    kernel: Annotated[str | None, typer.Option(help="only this kernel")] = None,
    db: DbOption = None,
) -> None:
    """Write one hardware's profile and all its records to a bundle file (the format /v1/bundles serves),
    streamed a page at a time; the file is replaced only once it is complete."""
    from jointtune.cli._checks import existing_store_url
    from jointtune.db import RecordKey, Store
    from jointtune.server.bundle import write_bundle
    from jointtune.server.limits import listed

    partial = output.with_name(output.name + ".partial")
    with Store(existing_store_url(db)) as store:
        if kernel is not None and not store.count_records(RecordKey.any(kernel=kernel, hardware_id=hardware)):
            stored = sorted({k.name for k in store.list_kernels()})
            raise BundleFileError(
                f"--kernel: {hardware!r} has no records of {kernel!r}; stored kernels: {listed(stored, len(stored))}"
            )
        try:
            with partial.open("w", encoding="utf-8") as out:
                count = write_bundle(store, hardware, out, kernel=kernel)
            if count is not None:
                partial.replace(output)
        except OSError as exc:
            raise BundleFileError(f"-o: {str(output)!r} can't be written ({exc.strerror})") from None
        finally:
            partial.unlink(missing_ok=True)
        known = listed(*store.hardware_ids()) if count is None else ""
    if count is None:  # at most 50 ids, as the service's 404 lists
        raise BundleFileError(f"--hardware: {hardware!r} is unknown in {store.display_url}; it has {known}")
    typer.echo(f"{output}: {_records(count)} for {hardware}")


def _records(count: int) -> str:
    return f"{count} record{'' if count == 1 else 's'}"


def import_command(
    bundles: Annotated[
        list[Path], typer.Argument(help="bundle files (from `jointtune export`, or pages of /v1/bundles)")
    ],
    db: DbOption = None,
) -> None:
    """Import bundle files in one transaction: every file is checked first, then all records are
    written or none; each record is kept only if it beats the stored one for its key."""
    from jointtune.db import Store
    from jointtune.server.bundle import import_bundles, parse_bundle

    parsed = []
    for path in bundles:
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise BundleFileError(f"bundle: {str(path)!r} can't be read ({exc.strerror})") from None
        parsed.append(parse_bundle(text, source=str(path)))  # every file checked before the store is opened
    with Store(db) as store:
        counts = import_bundles(store, parsed)
    names = ", ".join(str(path) for path in bundles)
    kept = counts["unchanged"]
    why = " (the store's record for its key was as fast or faster: identical, or better)" if kept else ""
    typer.echo(
        f"{names}: {_records(counts['records'])} for {counts['hardware_id']}: {counts['changed']} stored, "
        f"{kept} left as they were{why}"
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
    app.command("export")(export_command)
    app.command("import")(import_command)
