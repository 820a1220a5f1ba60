"""Shell: what each page shows, read the way the CLI reads it, and the two changes the dashboard makes.

The reads are the CLI's: `tpuq.operations.queries.list_jobs` and `tpuq.operations.fleetreport.annotate_waiting` (`tpuq list`),
`tpuq.operations.jobreader.JobReader` and `tpuq.operations.jobwatch` (`tpuq watch`, `tpuq logs`),
`tpuq.operations.fleetreport.all_fleet_views` (`tpuq fleet`), `tpuq.operations.deadletters` (`tpuq dead-letters`), `tpuq.ui.cost`,
`tpuq.operations.groups` (`tpuq status GROUP`, `tpuq list`'s folding), `tpuq.operations.notifyhealth` (`tpuq fleet`'s
failing notification destinations).
The changes are `tpuq cancel`'s and `tpuq set-priority`'s, from the client layer (`tpuq.operations.jobs`:
`request_cancel`, `cancel_refusal`, `change_priority`); the dashboard imports no CLI module. The filtering and
row shaping is pure (`job_rows`, `filter_jobs`) and tested without a backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Any

from tpuq.contracts.documents import TERMINAL_JOB_STATES, AttemptDoc, JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import Priority

PRIORITIES = tuple(p.value for p in Priority)
STATES = tuple(s.value for s in JobState)
JOBS_READ = 200  # the newest jobs the Jobs page reads (then filters by priority and search)
LOG_LINES_SHOWN = 2000  # a job page shows at most the last this many log lines


# ------------------------------------------------------------------------------------------------ jobs (core)
def filter_jobs(rows: list[Mapping[str, Any]], priority: str | None, search: str | None) -> list[Mapping[str, Any]]:
    """The rows of one priority whose id or name contains `search` (case-insensitive); newest first as read."""
    needle = (search or "").strip().lower()
    out = []
    for r in rows:
        if priority and r.get("priority") != priority:
            continue
        name = str(((r.get("spec") or {}).get("name")) or "")
        if needle and needle not in str(r.get("id") or "").lower() and needle not in name.lower():
            continue
        out.append(r)
    return out


def job_row(stored: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """One row of the Jobs page: id, name, state, priority, owner, attempts, type, zone, age, reason."""
    from tpuq.operations.jobs import shown_reason
    from tpuq.operations.fleetreport import waiting_shown
    from tpuq.operations.queries import age

    try:
        job = JobDoc.from_doc(stored)
    except Permanent as e:  # one unreadable job is shown as stored, not the end of the page
        return {"id": str(stored.get("id", "")), "name": "", "state": str(stored.get("state")), "priority": "",
                "owner": "", "attempts": "", "type": "", "zone": "", "age": "", "reason": str(e)}
    reason = (waiting_shown(stored["waiting"]) if stored.get("waiting")
              else (shown_reason(job) or job.blocked or ""))
    group = is_group_row(stored)  # a task's own attempts and zone are not the group's
    return {"id": job.id, "name": (job.spec or {}).get("name") or "", "state": job.state.value,
            "priority": job.priority or "", "owner": job.owner or "", "attempts": "" if group else attempts_cell(job),
            "type": ", ".join(job.spec_tpu), "zone": "" if group else job.zone or "", "group_row": group,
            "age": age(job.submit_time, now), "reason": reason.strip().splitlines()[0] if reason.strip() else ""}


def attempts_cell(job: JobDoc) -> str:
    """How many attempts the job made, and how many of them a preemption ended: `3 (2 preempted)`; "" for none."""
    made = max(job.attempts, job.attempt)
    if not made:
        return ""
    return f"{made} ({job.preemptions} preempted)" if job.preemptions else str(made)


def jobs_page(clients, now: datetime, tz: tzinfo, args: Mapping[str, str]) -> dict[str, Any]:
    from tpuq.operations.fleetreport import annotate_waiting
    from tpuq.operations.queries import list_jobs

    state = args.get("state") or None
    priority = args.get("priority") or None
    search = args.get("q") or ""
    filters = {"state": state if state in STATES else None, "priority": priority if priority in PRIORITIES else None,
               "q": search}
    filters["tasks"] = "1" if args.get("tasks") else None
    rows = list_jobs(clients.firestore, limit=JOBS_READ, state=filters["state"])
    rows = filter_jobs(rows, filters["priority"], search)
    if not filters["tasks"]:  # as `tpuq list`: a group is one row (its counts), linking to its page
        from tpuq.operations.groups import fold_groups, group_tasks, summary

        groups = sorted({r["group"] for r in rows if r.get("group")})
        rows = fold_groups(rows, {g: summary(g, group_tasks(clients.firestore, g)) for g in groups})
    annotate_waiting(clients.firestore, [r for r in rows if not is_group_row(r)], now, tz)
    query = "&".join(f"{k}={v}" for k, v in filters.items() if v)
    return {"rows": [job_row(r, now) for r in rows], "filters": filters, "states": STATES,
            "priorities": PRIORITIES, "query": query}


def is_group_row(row: Mapping[str, Any]) -> bool:
    """A row `fold_groups` made to stand for a group: its id is the group's."""
    return bool(row.get("group")) and row.get("group") == row.get("id")


# ------------------------------------------------------------------------------------------------ one group
def group_page(clients, group: str) -> dict[str, Any] | None:
    """`tpuq status GROUP` as a page: counts by state, progress, the failed tasks, and a row per task (index, sweep
    values, state, attempts, reason); None when `group` names no group (or names a job)."""
    from tpuq.operations.groups import group_exit_code, summary, sweep_keys, tasks_if_group
    from tpuq.operations.jobs import shown_reason

    tasks = tasks_if_group(clients.firestore, group)
    if not tasks:
        return None
    found = summary(group, tasks)
    keys = sweep_keys(tasks)
    rows = []
    for stored in tasks:
        job = JobDoc.from_doc(stored)
        env = (job.spec or {}).get("env") or {}
        reason = (shown_reason(job) or job.blocked or "").strip()
        rows.append({"index": "" if job.array_index is None else job.array_index, "id": job.id,
                     "sweep": [env.get(k, "") for k in keys], "state": job.state.value,
                     "attempts": attempts_cell(job), "reason": reason.splitlines()[0] if reason else ""})
    return {"group": {"id": group, "size": found.size, "stored": found.stored, "limit": found.limit,
                      "ended": found.ended, "counts": found.counts, "failed": found.failed,
                      "terminal": group_exit_code(found) is not None},
            "sweep_keys": keys, "tasks": rows}


# ------------------------------------------------------------------------------------------------ one job
def attempt_rows(stored_attempts: list[Mapping[str, Any]], tz: tzinfo, now: datetime) -> list[dict[str, Any]]:
    """The attempts as a timeline: number, zone, TPU, outcome, when each was assigned, started and ended, how long
    it ran, and a bar's offset and width (percent of the span from the first assignment to now or the last end)."""
    from tpuq.contracts.documents import short_node_name
    from tpuq.operations.fleetreport import local_time
    from tpuq.operations.jobwatch import duration

    views = [AttemptDoc.from_doc(doc) for doc in stored_attempts]
    starts = [a.assigned_at or a.started_at for a in views if (a.assigned_at or a.started_at)]
    ends = [a.ended_at or now for a in views]
    begin, end = (min(starts), max(ends)) if starts else (now, now)
    span = max((end - begin).total_seconds(), 1.0)
    rows = []
    for a in views:
        first = a.assigned_at or a.started_at
        last = a.ended_at or now
        rows.append({
            "attempt": a.attempt, "state": a.state.value, "zone": a.zone or "", "tpu": short_node_name(a.tpu) if a.tpu else "",
            "outcome": a.outcome or "", "detail": (a.detail or "")[:500],
            "assigned": local_time(a.assigned_at, tz, now) if a.assigned_at else "",
            "started": local_time(a.started_at, tz, now) if a.started_at else "",
            "ended": local_time(a.ended_at, tz, now) if a.ended_at else "",
            "ran": duration((last - a.started_at).total_seconds()) if a.started_at else "",
            "left": round(100 * (first - begin).total_seconds() / span, 1) if first else 0,
            "width": max(round(100 * (last - first).total_seconds() / span, 1), 1) if first else 1,
        })
    return rows


def job_page(clients, job_id: str, now: datetime, tz: tzinfo, worker: str | None,
             attempt: str | None = None) -> dict[str, Any] | None:
    """The job, its attempts, its workers (`tpuq watch`'s rows) and the log lines of one attempt (the latest, or
    `attempt`), of every worker merged by time or of one worker when given; None when no such job is stored."""
    from tpuq.operations.jobreader import JobReader
    from tpuq.operations.fleetreport import local_time
    from tpuq.operations.jobwatch import duration, where
    from tpuq.operations.queries import UnknownJob, attempts, get_job, timed_log_lines
    from tpuq.operations.runview import attempt_choices, log_header, merged_by_time
    from tpuq.contracts.workers import job_worker_labels

    try:
        stored = get_job(clients.firestore, job_id)
    except UnknownJob:
        return None
    reader = JobReader(clients, job_id, tz, details=True)
    watch = reader.read(now)
    if watch is None:
        return None
    job = JobDoc.from_doc(stored, job_id)
    stored_attempts = attempts(clients.firestore, job_id)
    choices = attempt_choices(stored_attempts)
    latest = max([job.attempt, *choices], default=0)
    asked = int(attempt) if attempt is not None and attempt.isdigit() else None
    shown_attempt = asked if asked in choices else (job.attempt or latest)
    chosen = int(worker) if worker is not None and worker.isdigit() else None
    timed = timed_log_lines(clients.storage, job, shown_attempt, None) if shown_attempt else []
    shown = [(w, line) for w, line in merged_by_time(timed) if chosen is None or w == chosen]
    spec = job.spec or {}
    workers = [{"worker": r.worker, "state": r.state, "exit_code": "" if r.exit_code is None else r.exit_code,
                "signal": r.signal or "", "elapsed": duration(r.elapsed), "last_line": r.last_line}
               for r in watch.workers]
    times = {label: local_time(when, tz, now) for label, when in
             (("submitted", job.submit_time), ("started", job.started_at), ("finished", job.finished_at))
             if isinstance(when, datetime)}
    rows = attempt_rows(stored_attempts, tz, now)
    worker_ids = sorted({w for w, _, _, _ in timed} | {r["worker"] for r in workers})
    label = job_worker_labels(job.spec_tpu, job.spec_slice_counts)  # w3, or s1/w0 on several slices
    shown_doc = next((a for a in map(AttemptDoc.from_doc, stored_attempts) if a.attempt == shown_attempt), None)
    return {
        "job": {"id": job.id, "name": spec.get("name") or "", "state": job.state.value, "priority": job.priority or "",
                "group": job.group or "", "array_index": job.array_index,
                "owner": job.owner or "", "type": ", ".join(job.spec_tpu), "command": spec.get("command") or "",
                "zone": job.zone or "", "reason": job.reason or "", "blocked": job.blocked or "",
                "terminal": job.state in TERMINAL_JOB_STATES, "pending": job.state is JobState.pending,
                "times": times, "where": where(watch), "waiting": list(watch.waiting),
                "elapsed": duration(watch.elapsed), "exit_code": watch.exit_code},
        "attempts": rows,
        "workers": workers,
        "worker_ids": worker_ids,
        "worker_labels": {w: label(w) for w in worker_ids},
        "worker": chosen,
        "attempt_ids": choices,
        "log_attempt": shown_attempt,
        "log_attempt_asked": asked if asked in choices else None,  # kept in the links and the poll
        "log_header": log_header(job.id, shown_attempt, max(latest, shown_attempt), shown_doc, tz, now)
        if shown_attempt else "",
        "log_lines": shown[-LOG_LINES_SHOWN:],
        "log_lines_cut": max(0, len(shown) - LOG_LINES_SHOWN),
        "priorities": PRIORITIES,
    }


def cancel_refusal_of(job: Mapping[str, Any], user: str | None) -> str | None:
    """What the confirmation says before cancelling someone else's job (`tpuq cancel`'s rule)."""
    from tpuq.operations.jobs import cancel_refusal

    return cancel_refusal(job["id"], job.get("owner") or None, user or "", force=False)


def cancel(clients, job_id: str, user: str, force: bool) -> tuple[str, bool]:
    """`tpuq cancel JOB` as `user` (with `--force` when asked): (what happened, whether it was asked)."""
    from tpuq.operations.jobs import cancel_refusal, request_cancel
    from tpuq.operations.queries import UnknownJob, get_job

    try:
        stored = get_job(clients.firestore, job_id)
    except UnknownJob as e:
        return str(e), False
    state = stored.get("state")
    if state in TERMINAL_JOB_STATES:
        return f"{job_id} already ended: {state}", False
    refusal = cancel_refusal(job_id, stored.get(JobDoc.field("owner")), user, force)
    if refusal:
        return refusal.split(": tpuq cancel")[0] + ": tick 'cancel it anyway' on the confirmation to cancel it", False
    request_cancel(clients, job_id, "cancelled by user (dashboard)", user)
    return f"cancel requested for {job_id} (state was {state})", True


def set_priority(clients, job_id: str, priority: str, now: datetime) -> tuple[str, bool]:
    """`tpuq set-priority JOB P`: (what happened, whether it changed)."""
    from tpuq.operations.jobs import change_priority, priority_refusal

    if priority not in PRIORITIES:
        return f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}", False
    result, job = change_priority(clients, job_id, Priority(priority), now)
    if result == "unknown":
        return f"no job {job_id!r}", False
    if result == "conflict":
        return priority_refusal(job_id, job), False
    if result == "same":
        return f"{job_id} already has priority {priority}", True
    return f"{job_id}: priority {priority} (was {job.get('priority')}); the scheduler re-plans now", True


# ------------------------------------------------------------------------------------------------ fleet
class CachedPrechecks:
    """`fleet_view`'s pre-check reader over a `tpuq.capacity.cloudchecks.PrecheckCache`: a page polled every few seconds
    asks the Cloud Quotas and Billing APIs at most once per the cache's TTL."""

    def __init__(self, cache):
        self.cache = cache

    def read(self, fleet, now):
        return self.cache.get(fleet, now)

    @classmethod
    def of(cls, clients) -> "CachedPrechecks | None":
        """For these clients' backend; None where there is nothing to read (emulators without those APIs)."""
        from tpuq.capacity.cloudchecks import cache_from_settings

        cache = cache_from_settings(clients.settings)
        return cls(cache) if cache else None


def fleet_page(clients, now: datetime, tz: tzinfo, prechecks: CachedPrechecks | None) -> list[dict[str, Any]]:
    """`tpuq fleet`'s view of every stored fleet, with the pre-checks (quota and its source, billing) when
    `prechecks` can read them."""
    from tpuq.contracts import store
    from tpuq.operations.fleetreport import entry_line, fleet_view

    views = []
    for snap in clients.firestore.collection(store.FLEETS).stream():
        try:
            view = fleet_view(clients.firestore, snap.id, now, tz, prechecks)
        except ValueError:
            continue  # a stored fleet file that no longer validates: `tpuq fleet` says why
        view["entry_lines"] = [entry_line(e) for e in view["entries"]]
        details = list(view.get("blocked_details") or [])
        view["blocks"] = [(reason, details[i] if i < len(details) else "") for i, reason in enumerate(view["blocked"])]
        views.append(view)
    return views


def notify_failing(clients, now: datetime) -> list[dict[str, Any]]:
    """The notification destinations failing (`tpuq fleet`'s `notify:` lines), project-wide: above every fleet."""
    from tpuq.operations.notifyhealth import failing_view

    return failing_view(clients.firestore, now)


# ------------------------------------------------------------------------------------------------ dead letters
def dead_letters_page(clients, tz: tzinfo, args: Mapping[str, str]) -> dict[str, Any]:
    from tpuq.operations import deadletters
    from tpuq.contracts import topology

    topics = [t.name for t in topology.TOPICS]
    topic = args.get("topic") if args.get("topic") in topics else None
    records, problem = deadletters.read_merged(clients, topic, 200)  # and what Pub/Sub dead-lettered
    return {"rows": [deadletters.row(r, tz) for r in records], "topics": topics, "topic": topic, "problem": problem}


# ------------------------------------------------------------------------------------------------ cost
def cost_page(clients, now: datetime, args: Mapping[str, str]) -> dict[str, Any]:
    from tpuq.ui.cost import CAUSES, chart_data, read_cost, totals

    days = int(args["days"]) if str(args.get("days", "")).isdigit() and 0 < int(args["days"]) <= 90 else 14
    rows = read_cost(clients.firestore, now, days)
    return {"rows": rows, "totals": totals(rows), "chart": chart_data(rows), "causes": CAUSES, "days": days}
