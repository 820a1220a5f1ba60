"""`tpuq dead-letters`: the messages the services refused (or gave up on), newest first."""

from __future__ import annotations

import json
from typing import Optional

import typer

from tpuq.cli.connecting import cli_clients
from tpuq.cli.console import out


def dead_letters(topic: Optional[str] = typer.Option(None, "--topic", help="Only messages of this topic, e.g. jobs"),
                 limit: int = typer.Option(50, min=1, max=1000, help="At most this many"),
                 as_json: bool = typer.Option(False, "--json", help="Machine-readable: every stored field")) -> None:
    """Refused messages: time, topic, message id, what it was about, the field and the reason."""
    from rich.table import Table

    from tpuq import deadletters, topology
    from tpuq.cli.fleet import local_zone

    topics = [t.name for t in topology.TOPICS]
    if topic is not None and topic not in topics:
        raise typer.BadParameter(f"no such topic (topics: {', '.join(topics)})", param_hint="--topic")
    records = deadletters.recent(cli_clients().firestore, topic, limit)
    if as_json:
        print(json.dumps([deadletters.as_json(r) for r in records], indent=2))
        return
    if not records:
        out.print("no refused messages" + (f" on topic {topic}" if topic else ""))
        return
    table = Table("time", "topic", "message id", "about", "field", "reason")
    for record in records:
        r = deadletters.row(record, local_zone())
        table.add_row(r["time"], r["topic"], r["message_id"], r["what"], r["field"], r["reason"])
    out.print(table)
