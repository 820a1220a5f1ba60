"""Rendering: the job table (`status`, `list`), one job's `watch` view and the `fleet` view."""

from __future__ import annotations

from rich.table import Table

from tpuq.cli.console import out
from tpuq.documents import JOB_STATES_ON_A_TPU, AttemptDoc, JobDoc, JobState
from tpuq.errors import Permanent


def json_default(value):
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def state_style(state) -> str:
    colour = {JobState.succeeded: "green", JobState.failed: "red", JobState.rejected: "red",
              JobState.cancelled: "yellow", JobState.running: "cyan", JobState.assigned: "cyan"}.get(state or "", "white")
    return f"[{colour}]{state}[/{colour}]"


def print_job(job_id: str, stored: dict, blocks: list[str]) -> None:
    """One job: its state, spec, reasons, the fleet's blocks (for a pending job) and every attempt."""
    job = JobDoc.from_doc(stored, job_id)
    spec = job.spec or {}
    out.print(f"[bold]{job_id}[/bold]  state: {state_style(job.state)}  priority: {job.priority}  "
              f"source: {job.source}")
    if spec:
        out.print(f"  tpu: {', '.join(job.spec_tpu)}   command: {spec.get('command')}")
    for key in ("reason", "blocked", "tpu", "zone", "job_bucket", "checkpoint_gcs_dir"):
        if getattr(job, JobDoc.field(key)):
            out.print(f"  {key}: {getattr(job, key)}")
    for reason in blocks:
        out.print(f"  [red]blocked:[/red] {reason}")
    for a in (AttemptDoc.from_doc(doc) for doc in stored["attempt_history"]):
        out.print(f"  attempt {a.attempt}: {a.state} {a.outcome or ''} on "
                  f"{a.tpu or '?'} {('- ' + a.detail[:200]) if a.detail else ''}")


def print_job_table(rows, now) -> None:
    from tpuq.queries import age

    if not rows:
        out.print("no jobs yet (tpuq submit job.yaml)")
        return
    table = Table("job", "state", "priority", "tpu", "age", "reason")
    for row in rows:
        try:
            j = JobDoc.from_doc(row)
        except Permanent as e:  # one unreadable job is shown as stored, not the end of the list
            table.add_row(row.get("id", ""), state_style(row.get("state")), "", "", "", str(e)[:60])
            continue
        table.add_row(j.id, state_style(j.state), j.priority or "", ",".join(j.spec_tpu), age(j.submit_time, now),
                      (j.reason or j.blocked or "")[:60])
    out.print(table)


def watch_view(stored: dict, statuses: dict) -> Table:
    job = JobDoc.from_doc(stored)
    table = Table(title=f"{job.id}: {job.state}  attempt {job.attempt}  {job.tpu or ''}", title_justify="left")
    table.add_column("worker")
    table.add_column("state")
    table.add_column("exit")
    hosts = max(len(statuses), 1 if job.state in JOB_STATES_ON_A_TPU else 0)
    for w in range(hosts):
        st = statuses.get(w)
        if st is not None:
            code = st.get("exit_code")
            table.add_row(str(w), "[green]exited[/green]" if code == 0 else "[red]exited[/red]", str(code))
        else:
            table.add_row(str(w), job.state, "")
    if job.reason:
        table.caption = job.reason
    return table


def print_fleet(view: dict) -> None:
    out.print(f"fleet [bold]{view['fleet']}[/bold]")
    for reason in view.get("blocked", []):
        out.print(f"[red]blocked:[/red] {reason}")
    qrs = Table("queued resource", "zone", "type", "state", "note", title="queued resources", title_justify="left")
    for q in view.get("queued_resources", []):
        qrs.add_row(q.get("name", ""), q.get("zone", ""), q.get("type", ""), q.get("state", ""), q.get("note", ""))
    out.print(qrs)
    tpus = Table("tpu", "zone", "type", "state", "job", "idle for", title="TPUs", title_justify="left")
    for t in view.get("tpus", []):
        tpus.add_row(t.get("short", ""), t.get("zone", ""), t.get("type", ""), t.get("state", ""), t.get("job_id") or "",
                     t.get("idle_for", ""))
    out.print(tpus)
    for z in view.get("zones", []):
        out.print(f"zone {z.get('key')}: {z.get('note')}")
