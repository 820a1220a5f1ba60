"""`tpuq dead-letters`: the messages the services refused (or gave up on), and those no handler ever answered,
which Pub/Sub dead-lettered (tpuq.operations.heldletters), newest first."""

from __future__ import annotations

import json
from typing import Optional

import typer

from tpuq.cli.connecting import cli_clients
from tpuq.cli.console import err, out


def dead_letters(topic: Optional[str] = typer.Option(None, "--topic", help="Only messages of this topic, e.g. jobs"),
                 limit: int = typer.Option(50, min=1, max=1000, help="At most this many"),
                 as_json: bool = typer.Option(False, "--json", help="Machine-readable: every stored field")) -> None:
    """Refused messages: time, topic, subscription, message id, what it was about, delivery attempts, the field and
    the reason; with the messages no handler ever answered, which Pub/Sub dead-lettered (reading those takes a few
    seconds and roles/pubsub.subscriber on the subscription dead-letters-hold)."""
    from rich.table import Table

    from tpuq.operations import deadletters

    from tpuq.contracts import topology
    from tpuq.cli.fleet import local_zone
    from tpuq.cli.views import tab_separated

    topics = [t.name for t in topology.TOPICS]
    if topic is not None and topic not in topics:
        raise typer.BadParameter(f"no such topic (topics: {', '.join(topics)})", param_hint="--topic")
    records, problem = deadletters.read_merged(cli_clients(), topic, limit)
    if problem:
        err.print(f"note: {problem}", markup=False, highlight=False)
    if as_json:
        print(json.dumps([deadletters.as_json(r) for r in records], indent=2))
        return
    if not records:
        out.print("no refused messages" + (f" on topic {topic}" if topic else ""))
        return
    header = ("time", "topic", "subscription", "message id", "about", "attempts", "field", "reason")
    rows = [(r["time"], r["topic"], r["subscription"], r["message_id"], r["what"], r["attempts"], r["field"],
             r["reason"]) for r in (deadletters.row(record, local_zone()) for record in records)]
    if not out.is_terminal:  # piped: one whole line per message, the reason unwrapped (tpuq.cli.views.tab_separated)
        print(tab_separated(header, rows))
        return
    table = Table(*header)
    for r in rows:
        table.add_row(*r)
    out.print(table)


def status_of_no_job(db, job_id: str, as_json: bool, held=None) -> bool:
    """`tpuq status ID` when ID is no stored job but names a message: one that was refused (`job-<message id>`,
    or a message that asked for this id), one that stored several jobs (a `jobs:` file), or one no handler ever
    answered (Pub/Sub dead-lettered it: `held()` reads those, tpuq.operations.deadletters.read_held, only when nothing else
    is found). True: printed."""
    from tpuq.operations import deadletters
    from tpuq.contracts import store
    from tpuq.cli.fleet import local_zone

    if db.collection(store.JOBS).document(job_id).get().exists:
        return False
    refused = deadletters.for_job_id(db, job_id)
    stored = [] if refused else deadletters.jobs_of_message(db, job_id)
    kept: list = []
    if not refused and not stored and held is not None:
        kept, problem = held()
        if problem:
            err.print(f"note: {problem}", markup=False, highlight=False)
        refused = deadletters.held_for_job_id(kept, job_id)
    if refused:
        if as_json:
            print(json.dumps({"id": job_id, "dead_letters": [deadletters.as_json(r) for r in refused]}, indent=2))
        else:
            out.print("\n".join(deadletters.status_lines(job_id, refused[0], local_zone())), markup=False,
                      highlight=False)
        return True
    if stored:
        if as_json:
            print(json.dumps({"id": job_id, "jobs": stored}, indent=2))
        else:
            out.print(f"{job_id} is no job: message {deadletters.message_id_of(job_id)} submitted {', '.join(stored)} "
                      "(tpuq status ID)", markup=False, highlight=False)
        return True
    unnamed = deadletters.unnamed_held(kept, job_id)
    if unnamed:  # perhaps one of these (Pub/Sub keeps no message id to tell): on stderr, the "no job" error follows
        err.print("\n".join(deadletters.unnamed_lines(job_id, unnamed, local_zone())), markup=False, highlight=False)
    return False


def refused_under(db, job_id: str, stored: dict) -> None:
    """Under a stored job: later messages that reused its id and were refused."""
    from tpuq.operations import deadletters
    from tpuq.cli.fleet import local_zone
    from tpuq.contracts.documents import JobDoc

    for record in deadletters.for_job_id(db, job_id):
        if record.get("message_id") != stored.get(JobDoc.field("message_id")):
            out.print("  " + deadletters.refused_line(record, local_zone()), markup=False, highlight=False)
