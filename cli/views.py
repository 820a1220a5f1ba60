"""Rendering: the job table (`status`, `list`), one job's `watch` view and the `fleet` view."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tpuq.cli.console import out
from tpuq.contracts.documents import JOB_STATES_ON_A_TPU, AttemptDoc, JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.operations.jobwatch import STOPPED
from tpuq.operations.jobs import blocked_label, shown_reason


def json_default(value):
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def state_style(state) -> str:
    colour = {JobState.succeeded: "green", JobState.failed: "red", JobState.rejected: "red",
              JobState.cancelled: "yellow", JobState.running: "cyan", JobState.assigned: "cyan"}.get(state or "", "white")
    return f"[{colour}]{state}[/{colour}]"


def print_job(job_id: str, stored: dict, blocks: list[str], details: list[str] = (), verbose: bool = False,
              now=None, tz=None) -> None:
    """One job: its state, owner, times (local, with their zone, each with its own age), spec, reasons, the fleet's
    blocks (for a pending job) and every attempt (when it started and ended). A field not set is left out."""
    from datetime import datetime, timezone

    from tpuq.operations.fleetreport import waiting_shown
    from tpuq.operations.jobwatch import requested_type
    from tpuq.operations.runview import attempt_line, job_head_fields, job_times

    now = now or datetime.now(timezone.utc)
    tz = tz or datetime.now().astimezone().tzinfo
    job = JobDoc.from_doc(stored, job_id)
    spec = job.spec or {}
    fields = "  ".join(f"{label}: {escape(value)}" for label, value in job_head_fields(job))
    out.print(f"[bold]{job_id}[/bold]  state: {state_style(job.state)}  {fields}", highlight=False)
    if spec:
        command = f"   command: {spec['command']}" if spec.get("command") else ""
        counts = job.spec_slice_counts
        slices = f"   slices: {', '.join(map(str, counts))}" if max(counts, default=1) > 1 else ""
        out.print(f"  tpu: {', '.join(job.spec_tpu)}{slices}{command}", highlight=False, markup=False)
    times = job_times(job, tz, now)
    if times:
        out.print(f"  {', '.join(times)}", highlight=False, markup=False)
    for key in ("reason", "waiting", "blocked", "tpu", "zone", "job_bucket", "checkpoint_gcs_dir"):
        # `waiting`: the scheduler's, for a job waiting on its dependencies; else what the CLI found holds a pending
        # job (tpuq.operations.fleetreport.annotate_waiting)
        value = (stored.get("waiting") if key == "waiting" else shown_reason(job) if key == "reason"
                 else getattr(job, JobDoc.field(key)))
        if value:
            label = blocked_label(job) if key == "blocked" else key
            shown = waiting_shown(value) if key == "waiting" else f"{label}: {value}"
            out.print(_indented(shown, "  "), highlight=False, markup=False)
    print_blocked(blocks, list(details), verbose, indent="  ")
    wanted = max(job.spec_slice_counts, default=1) if spec else 1  # a multislice job: what each attempt got
    for a in (AttemptDoc.from_doc(doc) for doc in stored.get("attempt_history") or []):
        detail = f" - {a.detail[:200]}" if a.detail else ""
        line = attempt_line(a, tz, now, requested_type(job), wanted)
        out.print(_indented(f"{line}{detail}", "  "), highlight=False, markup=False)


def _indented(text: str, indent: str) -> str:
    """`text` at `indent`, its further lines (a reason's "last lines of worker 2:" and the lines themselves) two
    spaces deeper, so that they read as part of the field they continue."""
    return indent + text.rstrip("\n").replace("\n", "\n" + indent + "  ")


JOB_TABLE = ("job", "state", "priority", "tpu", "owner", "age", "reason")


def job_table_rows(rows, now) -> list[tuple[str, ...]]:
    """`tpuq list`'s rows, as text (pure)."""
    from tpuq.operations.fleetreport import waiting_shown
    from tpuq.operations.queries import age
    from tpuq.operations.runview import owner_shown

    table = []
    for row in rows:
        try:
            j = JobDoc.from_doc(row)
        except Permanent as e:  # one unreadable job is shown as stored, not the end of the list
            table.append((str(row.get("id", "")), str(row.get("state")), "", "", "", "", str(e)))
            continue
        reason = waiting_shown(row["waiting"]) if row.get("waiting") else (shown_reason(j) or j.blocked or "")
        table.append((j.id, j.state.value, j.priority or "", ",".join(j.spec_tpu), owner_shown(j),
                      age(j.submit_time, now), reason.strip().splitlines()[0] if reason.strip() else ""))
    return table


def plain_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart, nothing cut or wrapped: what `tpuq list` prints
    when its output is not a terminal (a pipe, a file), where a width-80 table would break names mid-word."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    return "\n".join(lines)


def tab_separated(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A header line, then one line per row, the cells separated by tabs, each cell whole on its line (a newline or
    tab inside one becomes a space): what a list command prints when its output is not a terminal, for `cut -f`,
    `awk -F'\\t'` and `grep`, as `gh` does; the boxed table, wrapped at 80 columns, is for a terminal."""
    def cell(value) -> str:
        return " ".join(str(value if value is not None else "").split())

    return "\n".join("\t".join(cell(c) for c in r) for r in (header, *rows))


def print_job_table(rows, now, filtered: str | None = None) -> None:
    """`filtered`: what narrowed the list (`--state pending`, `--mine`), named when nothing is left."""
    if not rows:
        out.print(f"no jobs {filtered}" if filtered else "no jobs yet (tpuq submit job.yaml)")
        return
    text_rows = job_table_rows(rows, now)
    if not out.is_terminal:
        print(plain_table(JOB_TABLE, text_rows))
        return
    table = Table()
    for name in JOB_TABLE:
        # Nothing is cut off or elided: a cell too wide for its column wraps at its spaces, and a name longer than
        # the column is folded onto the next line, whole. (Not a terminal: plain_table, nothing wraps.)
        table.add_column(name, overflow="fold", no_wrap=name in ("state", "priority", "age"))
    for r in text_rows:
        table.add_row(r[0], state_style(r[1]), *(escape(c) for c in r[2:]))
    out.print(table)


def _worker_style(state: str) -> str:
    from tpuq.contracts.messages import AttemptOutcome

    if state == AttemptOutcome.failed_setup.value:
        return f"[red]{state}[/red]"
    if state in (AttemptOutcome.preempted.value, STOPPED):
        return f"[yellow]{state}[/yellow]"
    return state_style(state)


def watch_view(watch) -> Group:
    """`tpuq watch` on a terminal: the job's line (state, where it runs, for how long), why a pending job waits,
    then one row per worker of the slice: state, exit code, elapsed time, last log line (on several slices, every
    slice's workers grouped by slice, labelled `s1/w0`). `watch`: a
    `tpuq.operations.jobwatch.JobWatch`."""
    from rich.markup import escape

    from tpuq.operations.jobwatch import duration, first_line, where

    head = f"[bold]{escape(watch.job_id)}[/bold]  {state_style(watch.state)}"
    place = where(watch)
    if place:
        head += f"  {'assigned to' if watch.state is JobState.assigned else 'on'} {escape(place)}"
    if watch.elapsed is not None:
        head += f"  {'waiting' if watch.state is JobState.pending else 'for'} {duration(watch.elapsed)}"
    parts: list = [Text.from_markup(head)]
    if watch.ended_attempt and watch.state is JobState.pending:
        parts.append(Text(f"  {watch.ended_attempt}; it runs again", style="yellow"))
    parts += [Text(f"  {line}", style="yellow") for line in watch.waiting]
    if watch.state is JobState.pending and not watch.waiting:
        parts.append(Text("  waiting for a TPU", style="yellow"))
    if watch.workers:
        # A multislice job's rows are grouped by slice: a `slice` column naming the slice's node on its first row,
        # a rule between slices, and each worker labelled `s1/w0` (tpuq.contracts.workers).
        by_slice = any(row.slice_id is not None for row in watch.workers)
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        if by_slice:
            table.add_column("slice")
        table.add_column("worker", justify="right")
        table.add_column("state")
        table.add_column("exit", justify="right")
        table.add_column("elapsed", justify="right")
        table.add_column("last line", overflow="ellipsis", no_wrap=True, max_width=120)
        rows = watch.workers
        for i, row in enumerate(rows):
            code = "" if row.exit_code is None else str(row.exit_code) + (f" ({row.signal})" if row.signal else "")
            cells = [row.name, _worker_style(row.state), code, duration(row.elapsed), Text(row.last_line)]
            last_of_slice = by_slice and i + 1 < len(rows) and rows[i + 1].slice_id != row.slice_id
            if by_slice:
                first_of_slice = i == 0 or rows[i - 1].slice_id != row.slice_id
                cells.insert(0, _slice_cell(watch, row.slice_id) if first_of_slice else "")
            table.add_row(*cells, end_section=last_of_slice)
        parts.append(table)
    elif watch.state in JOB_STATES_ON_A_TPU:
        parts.append(Text("  no workers known yet"))
    if watch.reason and (watch.terminal or watch.state is JobState.pending):
        parts.append(Text(f"  {first_line(watch.reason)}", style="red" if watch.exit_code else ""))
    if watch.terminal:
        parts.append(Text(f"  exit status {watch.exit_code}"))
    return Group(*parts)


def _slice_cell(watch, slice_id: int | None) -> str:
    """`s1 tpuq-abc-1`: a slice and its node (the node is not known before the attempt has its gang)."""
    node = watch.nodes[slice_id] if slice_id is not None and slice_id < len(watch.nodes) else (
        watch.node if slice_id == 0 else None)
    return f"s{slice_id}" + (f" {node}" if node else "")


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


def print_blocked(reasons: list[str], details: list[str], verbose: bool, indent: str = "") -> None:
    """Each blocked reason, short; with `verbose` the API's own error under it."""
    for i, reason in enumerate(reasons):
        out.print(f"{indent}[red]blocked:[/red] {escape(reason)}", highlight=False)
        detail = details[i] if i < len(details) else ""
        if verbose and detail:
            out.print(f"{indent}  the API said: {detail}", highlight=False, markup=False)


def print_fleet(view: dict, verbose: bool = False) -> None:
    from tpuq.operations.fleetreport import entry_line

    out.print(f"fleet [bold]{view['fleet']}[/bold]")
    for entry in view.get("entries", []):
        out.print(f"  entry {entry_line(entry)}", highlight=False, markup=False)
    print_blocked(view.get("blocked", []), view.get("blocked_details", []), verbose)
    print_brakes(view.get("brakes") or {})
    if "billing" in view:
        out.print(f"billing: {view['billing']}", highlight=False, markup=False)
    for line in view.get("precheck_problems", []):
        out.print(f"pre-check: {line}", highlight=False, markup=False)
    for e in view.get("existing", []):
        if e.get("usable"):
            out.print(f"existing TPU {e['node']} ({e['zone']}, {e['type']}): in use by tpuq", highlight=False,
                      markup=False)
        else:
            out.print(e.get("problem") or f"existing TPU {e['node']}: not usable", highlight=False, markup=False)
            if e.get("fix"):
                out.print(f"  run: {e['fix']}", highlight=False, markup=False, soft_wrap=True)
    for q in view.get("quota", []):
        out.print(f"quota {q['zone']} {q['type']}: {q['note']}", highlight=False, markup=False)
    qrs = [(q.get("name", ""), q.get("zone", ""), q.get("type", ""), q.get("state", ""), q.get("note", ""))
           for q in view.get("queued_resources", [])]
    print_rows("queued resources", ("queued resource", "zone", "type", "state", "note"), qrs)
    tpus = [(t.get("short", ""), t.get("zone", ""), t.get("type", ""), t.get("state", ""), t.get("job_id") or "",
             t.get("idle_for", ""), t.get("health", "")) for t in view.get("tpus", [])]
    print_rows("TPUs", ("tpu", "zone", "type", "state", "job", "idle for", "health"), tpus)
    targets = []
    for r in view.get("targets", []):
        quota = (f"unlimited ({r.get('quota_source')})" if r.get("quota_unlimited") else "not checked"
                 if r.get("quota_chips") is None else f"{r['quota_chips']} ({r.get('quota_source')})")
        targets.append((r["zone"], r["type"], quota, ", ".join(r.get("racing") or []) or "-",
                        "see below" if r.get("note") else ""))
    print_rows("zones and types", ("zone", "type", "quota (chips)", "racing", "held by"), targets)
    # What holds a zone, in full on its own line: a raw API error or a quota detail is too long for a cell.
    for z in view.get("zones", []):
        out.print(f"zone {z['key']}: {z['note']}", highlight=False, markup=False)
        if verbose and z.get("detail"):
            out.print(f"  the API said: {z['detail']}", highlight=False, markup=False)
    print_unheld(view.get("unheld_jobs", []))


def print_rows(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A titled table on a terminal; piped, the title and `tab_separated` lines, nothing wrapped."""
    if not out.is_terminal:
        print(f"{title}:")
        print(tab_separated(header, rows))
        return
    table = Table(*header, title=title, title_justify="left")
    for r in rows:
        table.add_row(*r)
    out.print(table)


def print_unheld(unheld: list[dict]) -> None:
    """Pending jobs that nothing holds (tpuq.contracts.liveness): a bug in tpuq, shown as one, never as a plain "pending"."""
    for u in unheld:
        out.print(f"[red]job {escape(u['job'])} pending, {escape(u['reason'])}[/red]", highlight=False)


def print_overview(view: dict, verbose: bool = False) -> None:
    """`tpuq status` without a job: each fleet's entries, TPUs and queued resources by state, what blocks it,
    then the queue by state."""
    def counts(by_state: dict) -> str:
        return ", ".join(f"{n} {state}" for state, n in by_state.items()) or "none"

    if not view["fleets"]:
        out.print("no fleet stored yet (tpuq fleet apply fleet.yaml)")
    for f in view["fleets"]:
        paused = "  [yellow]paused[/yellow]" if f["paused"] else ""
        out.print(f"fleet [bold]{f['fleet']}[/bold] (project {f['project']}){paused}")
        for e in f["entries"]:
            where = f"existing {e['existing']}" if e["existing"] else f"up to {e['count']} in {', '.join(e['zones'])}"
            warm = f", {e['keep_warm_count']} kept warm" if e["keep_warm_count"] else ""
            out.print(f"  entry {e['id']}: {e['type']} {e['provisioning_model']}, {where}{warm}", highlight=False)
        out.print(f"  TPUs: {counts(f['tpus'])}", highlight=False)
        out.print(f"  queued resources: {counts(f['queued_resources'])}; open capacity requests: {f['requests_open']}",
                  highlight=False)
        print_blocked(f["blocked"], f.get("blocked_details", []), verbose, indent="  ")
        for z in f["zones"]:
            out.print(f"  {z['key']}: {z['note']}", highlight=False)
            if verbose and z.get("detail"):
                out.print(f"    the API said: {z['detail']}", highlight=False, markup=False)
    jobs = {state: n for state, n in view["jobs"].items() if n}
    out.print(f"jobs: {counts(jobs)}", highlight=False)
    print_unheld(view.get("unheld_jobs", []))
    out.print("one job: tpuq status JOB; the recent ones: tpuq list; the fleet in detail: tpuq fleet")
