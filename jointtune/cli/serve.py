"""`jointtune serve`, `jointtune export`, `jointtune import`: run the service, move bundles offline.

Export and import use the same bundle format as `/v1/bundles`. Import validates the whole file
before writing anything, so a bad bundle leaves the store untouched (one-line error, exit 2).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from jointtune.errors import JointtuneError, ServiceError

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
    workers: Annotated[int, typer.Option(help="worker processes", min=1, max=64)] = 1,
    db: DbOption = None,
) -> None:
    """Run the config service (uvicorn); migrations are applied before it starts listening."""
    import uvicorn

    from jointtune.db import open_store, resolve_db_url
    from jointtune.server.auth import TokenSet
    from jointtune.server.settings import Settings

    url = resolve_db_url(db)
    os.environ["JOINTTUNE_DB_URL"] = url  # workers build their app from the environment
    settings = Settings()  # bad JOINTTUNE_* settings fail here, once, not in every worker
    TokenSet.load(settings.tokens, settings.tokens_file)
    open_store(url).close()
    if workers == 1:
        uvicorn.run("jointtune.server.app:app_from_env", factory=True, host=host, port=port, log_level="info")
        return
    # uvicorn's shared socket for several workers is made with protocol 0, so asyncio never sets
    # TCP_NODELAY on accepted connections and every keep-alive response waits ~40 ms for a delayed
    # ACK (measured: bench/README.md, "Config service load"). Make the socket ourselves.
    from uvicorn.supervisors import Multiprocess

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise ServiceError(f"--host/--port: can't listen on {host}:{port} ({exc.strerror})") from None
    config = uvicorn.Config(
        "jointtune.server.app:app_from_env", factory=True, host=host, port=port, workers=workers, log_level="info"
    )
    Multiprocess(config, sockets=[sock]).run()


def export_command(
    hardware: Annotated[str, typer.Option("--hardware", help="hardware id to export")],
    output: Annotated[Path, typer.Option("-o", "--output", help="bundle file to write")],
    kernel: Annotated[str | None, typer.Option(help="only this kernel")] = None,
    db: DbOption = None,
) -> None:
    """Write one hardware's profile and records to a bundle file (the format /v1/bundles serves)."""
    from jointtune.db import Store
    from jointtune.server.bundle import export_bundle

    with Store(db) as store:
        bundle = export_bundle(store, hardware, kernel)
        known = [h.hardware_id for h in store.list_hardware()] if bundle is None else []
    if bundle is None:
        raise BundleFileError(f"--hardware: {hardware!r} is unknown in {store.display_url}; it has {known}")
    try:
        output.write_text(json.dumps(bundle, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise BundleFileError(f"-o: {str(output)!r} can't be written ({exc.strerror})") from None
    typer.echo(f"{output}: {len(bundle['records'])} records for {hardware}")


def import_command(
    bundle: Annotated[Path, typer.Argument(help="bundle file (from `jointtune export` or /v1/bundles)")],
    db: DbOption = None,
) -> None:
    """Import a bundle file; each record is kept only if it beats the stored one for its key."""
    from jointtune.db import Store
    from jointtune.server.bundle import import_bundle, parse_bundle

    try:
        data = json.loads(bundle.read_text())
    except OSError as exc:
        raise BundleFileError(f"bundle: {str(bundle)!r} can't be read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleFileError(f"bundle: {str(bundle)!r} is not JSON ({exc})") from None
    parse_bundle(data)  # the whole file is checked before the store is even opened
    with Store(db) as store:
        counts = import_bundle(store, data)
    typer.echo(
        f"{bundle}: {counts['records']} records for {counts['hardware_id']}: "
        f"{counts['changed']} stored, {counts['unchanged']} kept the existing better record"
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
    app.command("export")(export_command)
    app.command("import")(import_command)
