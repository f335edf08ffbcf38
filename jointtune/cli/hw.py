"""`jointtune hw`: show this machine's hardware fingerprint, the one tuned configs are keyed by.

Useful before a sweep (is this the hardware the store already has results for?) and to record a
machine: `jointtune hw --json > fingerprint.json`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("hw")(hw)


def hw(
    as_json: Annotated[bool, typer.Option("--json", help="Print the fingerprint as JSON.")] = False,
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", help="GPUs a node gives the job (default: those torch sees)."),
    ] = None,
) -> None:
    """Show the hardware fingerprint: key fields (they make the hardware id), the architecture derived from them
    (GPUs of one architecture share warm starts) and recorded versions."""
    from jointtune.hardware import KEY_FIELDS, detect

    fingerprint = detect(gpus_per_node=gpus_per_node)
    data = fingerprint.to_json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"hardware id: {fingerprint.hardware_id}", title_justify="left")
    table.add_column("field")
    table.add_column("value")
    table.add_column("role")
    for field, value in data.items():
        if field == "hardware_id":
            continue
        shown = "-" if value is None else ".".join(map(str, value)) if isinstance(value, list) else str(value)
        role = "key" if field in KEY_FIELDS else "derived" if field == "arch" else "recorded"
        table.add_row(field, shown, role)
    Console().print(table)
