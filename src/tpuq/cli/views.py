"""Rendering: the job table (`status`, `list`), one job's `watch` view and the `fleet` view."""

from __future__ import annotations

from rich.table import Table

from tpuq.cli.console import out
from tpuq.documents import JOB_STATES_ON_A_TPU, JobState


def json_default(value):
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def state_style(state) -> str:
    colour = {JobState.succeeded: "green", JobState.failed: "red", JobState.rejected: "red",
              JobState.cancelled: "yellow", JobState.running: "cyan", JobState.assigned: "cyan"}.get(state or "", "white")
    return f"[{colour}]{state}[/{colour}]"


def print_job(job_id: str, job: dict, blocks: list[str]) -> None:
    """One job: its state, spec, reasons, the fleet's blocks (for a pending job) and every attempt."""
    spec = job.get("spec") or {}
    out.print(f"[bold]{job_id}[/bold]  state: {state_style(job.get('state'))}  priority: {job.get('priority')}  "
              f"source: {job.get('source')}")
    if spec:
        out.print(f"  tpu: {', '.join(spec.get('tpu', []))}   command: {spec.get('command')}")
    for key in ("reason", "waiting", "blocked", "tpu", "zone", "job_bucket", "checkpoint_gcs_dir"):
        if job.get(key):
            out.print(f"  {key}: {job[key]}")
    for reason in blocks:
        out.print(f"  [red]blocked:[/red] {reason}")
    for a in job["attempt_history"]:
        out.print(f"  attempt {a.get('attempt')}: {a.get('state') or ''} {a.get('outcome') or ''} on "
                  f"{a.get('tpu') or '?'} {('- ' + a['detail'][:200]) if a.get('detail') else ''}")


def print_job_table(rows, now) -> None:
    from tpuq.queries import age

    if not rows:
        out.print("no jobs yet (tpuq submit job.yaml)")
        return
    table = Table("job", "state", "priority", "tpu", "age", "reason")
    for j in rows:
        table.add_row(j.get("id", ""), state_style(j.get("state")), j.get("priority") or "",
                      ",".join((j.get("spec") or {}).get("tpu", [])), age(j.get("submit_time"), now),
                      f"waiting: {j['waiting']}" if j.get("waiting") else (j.get("reason") or j.get("blocked") or "")[:60])
    out.print(table)


def watch_view(job: dict, statuses: dict) -> Table:
    from tpuq.tputypes import parse_accelerator_type

    table = Table(title=f"{job['id']}: {job.get('state')}  attempt {job.get('attempt') or 0}  "
                        f"{job.get('tpu') or ''}", title_justify="left")
    table.add_column("worker")
    table.add_column("state")
    table.add_column("exit")
    hosts = 0
    if job.get("tpu_type"):
        hosts = parse_accelerator_type(job["tpu_type"]).hosts
    hosts = max(hosts, len(statuses), 1 if job.get("state") in JOB_STATES_ON_A_TPU else 0)
    for w in range(hosts):
        st = statuses.get(w)
        if st is not None:
            code = st.get("exit_code")
            table.add_row(str(w), "[green]exited[/green]" if code == 0 else "[red]exited[/red]", str(code))
        else:
            table.add_row(str(w), job.get("state") or "", "")
    if job.get("reason"):
        table.caption = job["reason"]
    return table


def print_brakes(brakes: dict) -> None:
    """Claiming on or stopped (and why), the day's VM-hours against the budget, the grant's days left, a drain."""
    if brakes.get("stopped"):
        out.print(f"[red]claiming stopped:[/red] {brakes['stopped']}", highlight=False)
    budget, grant, drain = brakes.get("budget"), brakes.get("grant"), brakes.get("drain")
    if budget:
        out.print(f"budget: {budget['used_today']:.1f} of {budget['vm_hours_per_day']:g} VM-hours used today "
                  f"({budget['day']} UTC), {budget['alive_hosts']} host(s) alive", highlight=False)
    if grant:
        out.print(f"grant: expires {grant['expires']}, {grant['days_left']} day(s) left", highlight=False)
    if drain:
        state = "done" if drain["done"] else "in progress"
        out.print(f"drain {drain['id']}: {state}, {len(drain['deleted'])} deleted", highlight=False)


def print_fleet(view: dict) -> None:
    from tpuq.fleetreport import entry_line

    out.print(f"fleet [bold]{view['fleet']}[/bold]")
    for entry in view.get("entries", []):
        out.print(f"  entry {entry_line(entry)}", highlight=False, markup=False)
    for reason in view.get("blocked", []):
        out.print(f"[red]blocked:[/red] {reason}")
    print_brakes(view.get("brakes") or {})
    if "billing" in view:
        out.print(f"billing: {view['billing']}", highlight=False, markup=False)
    for line in view.get("precheck_problems", []):
        out.print(f"pre-check: {line}", highlight=False, markup=False)
    for q in view.get("quota", []):
        out.print(f"quota {q['zone']} {q['type']}: {q['note']}", highlight=False, markup=False)
    qrs = Table("queued resource", "zone", "type", "state", "note", title="queued resources", title_justify="left")
    for q in view.get("queued_resources", []):
        qrs.add_row(q.get("name", ""), q.get("zone", ""), q.get("type", ""), q.get("state", ""), q.get("note", ""))
    out.print(qrs)
    tpus = Table("tpu", "zone", "type", "state", "job", "idle for", title="TPUs", title_justify="left")
    for t in view.get("tpus", []):
        tpus.add_row(t.get("short", ""), t.get("zone", ""), t.get("type", ""), t.get("state", ""), t.get("job_id") or "",
                     t.get("idle_for", ""))
    out.print(tpus)
    targets = Table("zone", "type", "quota (chips)", "racing", "held by", title="zones and types",
                    title_justify="left")
    for r in view.get("targets", []):
        quota = "not checked" if r.get("quota_chips") is None else f"{r['quota_chips']} ({r.get('quota_source')})"
        targets.add_row(r["zone"], r["type"], quota, ", ".join(r.get("racing") or []) or "-", r.get("note") or "")
    out.print(targets)
