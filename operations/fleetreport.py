"""`tpuq fleet`: the claimer's view (queued resources, back-offs, drops, blocked) plus the TPUs the scheduler holds,
per zone and type (quota and its source, racers, back-off in local time, drop), the brakes (paused, the day's
VM-hours against the budget, the grant's days left, a drain), and what holds each waiting job.

Read-only, through the documents' typed views (`tpuq.contracts.documents`): nothing here imports a service.
"""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from tpuq.contracts import documents, store
from tpuq.capacity.brakes import DayUse, claim_stop_reason, day_start, day_use, grant_days_left
from tpuq.contracts.documents import (QR_STATES_RACING, JobDoc, JobState, NodeHealth, QueuedResourceState, RequestStatus, TpuDoc,
                                      TpuState, short_node_name)
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import ANY_TPU
from tpuq.contracts.messages import FailureClass
from tpuq.runtime.fleetstore import FleetControl, load_control, load_fleet
from tpuq.contracts.liveness import LIVENESS_BOUND, nothing_holds
from tpuq.operations.queries import age
from tpuq.capacity.quota import BILLING_OFF_MESSAGE
from tpuq.contracts.tputypes import canonical_name, zone_region


# Failures after which the claimer stops a zone and type for a long back-off rather than a capacity one.
STOPPING_FAILURES = (FailureClass.unknown, FailureClass.external_ip_quota)


def fleet_view(db, name: str | None, now: datetime, tz: tzinfo | None = None, prechecks_reader=None) -> dict[str, Any]:
    """`tpuq fleet`'s view model (also its --json): read Firestore (and, with a `tpuq.capacity.cloudchecks.PrecheckReader`,
    quota and billing now), then `build_view`."""
    fleet = load_fleet(db, name)
    report = fleet_report(db, fleet.name, now)
    tpus = [s.to_dict() for s in db.collection(store.TPUS).where(filter=FieldFilter("fleet", "==", fleet.name))
            .stream()]
    prechecks = prechecks_reader.read(fleet, now) if prechecks_reader is not None else None
    return build_view(fleet, report, tpus, load_control(db, fleet.name), now, tz or timezone.utc, prechecks)


def health_note(tpu: dict[str, Any], now: datetime) -> str:
    """The TPUs table's health cell: why the node takes no new job (unhealthy, maintenance soon: the matcher's rule,
    `NodeHealth.refuses_new_job`), else its health as the API reports it, or "" when never read."""
    health = NodeHealth.from_doc(tpu)
    if health is None:
        return ""
    return health.refuses_new_job(now) or (health.health.value if health.health else "")


def build_view(fleet: FleetFile, report: dict[str, Any], tpu_docs: list[dict[str, Any]], control: FleetControl,
               now: datetime, tz: tzinfo, prechecks=None) -> dict[str, Any]:
    """Pure: the view model of one fleet. `tz`: the zone times are shown in (the machine's local one);
    `prechecks`: a `tpuq.capacity.quota.Prechecks` (billing, quota from the Cloud Quotas API), or None: not shown."""
    notes = {}
    for q in report["queued_resources"]:
        note = q.get("failure_class") or ""
        if q.get("delete_requested"):
            note = (note + " delete requested").strip()
        notes[q["name"]] = note
    tpus = []
    for t in tpu_docs:
        if t.get("state") == TpuState.gone:
            continue
        t = dict(t)
        t["idle_for"] = age(t.get(TpuDoc.field("idle_since")), now) if t.get("state") == TpuState.idle else ""
        t["health"] = health_note(t, now)
        tpus.append(t)
    checks = precheck_view(fleet, prechecks) if prechecks is not None else {}
    targets = target_rows(fleet, report, now, tz, prechecks.quota if prechecks is not None else None)
    zones = [{"key": f"{r['zone']} {r['type']}", "note": r["note"], "detail": r["dropped_detail"]}
             for r in targets if r["note"]]
    blocked = [report["blocked"]] if report["blocked"] else []
    details = [report.get("blocked_detail") or ""] if report["blocked"] else []  # the API's error, one per reason
    existing = [{**e, "type": entry.type, "zone": entry.zones[0]} for e in report.get("existing", [])
                if (entry := fleet.entry(e["entry_id"])) is not None and entry.existing == e["node"]]
    if checks.get("billing_block") and not any(b.startswith("billing is disabled") for b in blocked):
        blocked.append(checks["billing_block"])
        details.append(BILLING_OFF_MESSAGE)
    checks.pop("billing_block", None)
    return {
        **checks,
        "fleet": fleet.name,
        "version": report["version"],
        "entries": entries_view(fleet),
        "blocked": blocked,
        "blocked_details": details,
        "existing": existing,
        "brakes": brakes_view(fleet, control, day_use(tpu_docs, fleet.name, now), now, tz),
        "requests": report["requests"],
        "queued_resources": [
            {**q, "name": short_node_name(q["name"]), "note": notes.get(q["name"], "")}
            for q in report["queued_resources"]
        ],
        "tpus": sorted(tpus, key=lambda t: t.get("short", "")),
        "targets": targets,
        "zones": zones,
    }


def entries_view(fleet: FleetFile) -> list[dict[str, Any]]:
    """The fleet file's entries: what the fleet may hold (type, zones, at most how many slices, spot or on-demand,
    idle timeout); shown by `tpuq fleet` and `tpuq dev up` before anything has been created."""
    return [{"id": e.id, "type": e.type, "zones": list(e.zones), "count": e.max_slices,
             "tier": e.provisioning_model.value, "keep_warm": e.keep_warm_count, "existing": e.existing,
             "idle_timeout_seconds": (e.idle_timeout_seconds if e.idle_timeout_seconds is not None
                                      else fleet.idle_timeout_seconds)}
            for e in fleet.tpus]


def entry_line(entry: dict[str, Any]) -> str:
    """One entry for people: "v4-single: up to 2 x v4-8 (spot) in us-central2-a, us-central2-b; idle 8 s"."""
    if entry.get("existing"):
        return f"{entry['id']}: the existing node {entry['existing']} ({entry['type']}) in {', '.join(entry['zones'])}"
    warm = f", {entry['keep_warm']} kept warm" if entry.get("keep_warm") else ""
    return (f"{entry['id']}: up to {entry['count']} x {entry['type']} ({entry['tier']}) in {', '.join(entry['zones'])}; "
            f"idle timeout {entry['idle_timeout_seconds']} s{warm}")


def precheck_view(fleet, prechecks) -> dict[str, Any]:
    """The pre-checks' lines for `tpuq fleet`: billing, quota per zone and type with its source, skipped zones."""
    from tpuq.capacity.quota import billing_block_reason

    billing = prechecks.billing
    quota = []
    for entry in fleet.tpus:
        if entry.existing:
            continue
        for zone in entry.zones:
            q = prechecks.quota.of(zone, entry.accelerator, entry.provisioning_model)
            if q is not None:
                quota.append({"zone": zone, "type": entry.type, "chips": q.chips, "source": q.source.value,
                              "note": q.describe()})
    return {
        "billing": "enabled" if billing.enabled else "disabled" if billing.disabled else f"unknown ({billing.error})",
        "billing_block": billing_block_reason(fleet.project) if billing.disabled else None,
        "quota": quota,
        "precheck_problems": prechecks.problems,
    }


def all_fleet_views(db, now: datetime, tz: tzinfo) -> list[dict[str, Any]]:
    """The view of every stored fleet (a fleet file that no longer validates is left out)."""
    views = []
    for snap in db.collection(store.FLEETS).stream():
        try:
            views.append(fleet_view(db, snap.id, now, tz))
        except ValueError:
            continue
    return views


def annotate_waiting(db, jobs: list[dict[str, Any]], now: datetime, tz: tzinfo) -> None:
    """Set `waiting` on each pending job: what holds it (`tpuq status`, `tpuq list`). A job that nothing holds
    (`tpuq.contracts.liveness`) says so first, and `unheld` gives the reason."""
    if not any(j.get("state") == JobState.pending for j in jobs):
        return
    views = all_fleet_views(db, now, tz)
    open_ids = open_request_ids(views)
    for j in jobs:
        if j.get(JobDoc.field("waiting")):
            continue  # it waits for its dependencies (stored by the scheduler): what the fleet does holds it not
        reason = waiting_reason(j, views, now, tz)
        unheld = _unheld_reason(j, open_ids, now)
        if unheld:
            j["unheld"] = unheld
            reason = "; ".join(part for part in (unheld, reason) if part)
        if reason:
            j["waiting"] = reason


def waiting_shown(waiting: str) -> str:
    """A `waiting` as a list or a page shows it: the scheduler's "waiting for train-3 (running)" as it is, what the
    CLI found behind "waiting: "."""
    return waiting if waiting.startswith("waiting for ") else f"waiting: {waiting}"


def open_request_ids(views: list[dict[str, Any]]) -> set[str]:
    """The capacity requests the claimer holds open, over the fleets' views."""
    return {r["request_id"] for view in views for r in view.get("requests", [])}


def _unheld_reason(job: dict[str, Any], open_ids: set[str], now: datetime) -> str | None:
    try:
        return nothing_holds(JobDoc.from_doc(job), open_ids, now)
    except Permanent:
        return None  # an unreadable job: `tpuq status` says so itself


UNHELD_SCAN = 200  # pending jobs with no stated reason read by `unheld_jobs`, longest unchanged first


def unheld_jobs(db, now: datetime) -> list[dict[str, Any]]:
    """Pending jobs that nothing holds (`tpuq.contracts.liveness`: a tpuq bug made visible), as {job, reason}: for `tpuq
    fleet` and `tpuq status`. Reads the pending jobs with no stated reason, unchanged for longer than the bound
    (index: state, blocked, updated_at), so the jobs the scheduler explains are not read at all; then the claimer's
    open requests, of every fleet (after the jobs: a request recorded meanwhile counts as open)."""
    q = (db.collection(store.JOBS)
         .where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.pending.value))
         .where(filter=FieldFilter(JobDoc.field("blocked"), "==", None))
         .where(filter=FieldFilter(JobDoc.field("updated_at"), "<=", now - LIVENESS_BOUND))
         .order_by(JobDoc.field("updated_at")).limit(UNHELD_SCAN))
    pending = [{**(s.to_dict() or {}), "id": s.id} for s in q.stream()]
    if not pending:
        return []
    open_ids = {s.id for s in db.collection(store.REQUESTS)
                .where(filter=FieldFilter("status", "==", RequestStatus.open.value)).stream()}
    found = [(job["id"], _unheld_reason(job, open_ids, now)) for job in pending]
    return [{"job": job_id, "reason": reason} for job_id, reason in found if reason]


def local_time(when: datetime, tz: tzinfo, now: datetime) -> str:
    """`14:03:27 CET`; with the day when it is not today there (`Wed 02 Dec 14:03:27 CET`). With the seconds: a
    back-off of 30 s printed as `14:03` at 14:03:29 says nothing about when it ends."""
    local = when.astimezone(tz)
    if local.date() != now.astimezone(tz).date():
        return local.strftime("%a %d %b %H:%M:%S %Z")
    return local.strftime("%H:%M:%S %Z")


def local_time_until(when: datetime, tz: tzinfo, now: datetime) -> str:
    """`14:03:27 CET (in 23s)`: a time to come, and how far off it is; a past one as `local_time`."""
    from tpuq.operations.queries import age

    shown = local_time(when, tz, now)
    return f"{shown} (in {age(now, when)})" if (when - now).total_seconds() >= 1 else shown  # never "(in 0s)"


def target_rows(fleet: FleetFile, report: dict[str, Any], now: datetime, tz: tzinfo,
                quota=None) -> list[dict[str, Any]]:
    """One row per zone and type the fleet may claim: quota and its source, racers, back-off, drop.

    `quota`: the claimer's effective quota (`tpuq.capacity.quota.EffectiveQuota`); None: the fleet file's declarations.
    `quota_source` says where `quota_chips` came from: "fleet file" (the `quota:` block), "Cloud Quotas API", or
    None (not checked). `quota_unlimited`: the API said -1 (unlimited), so `quota_chips` is None but checked.
    `skipped` is why the claimer does not queue there at all (None: it may). `last_error`: the API's text of the
    last failure there, as the claimer recorded it."""
    from tpuq.capacity.quota import declared_quota, skipped_zones

    quota = quota if quota is not None else declared_quota(fleet)
    skipped = {(z["zone"], z["type"]): z["reason"] for z in skipped_zones(fleet, quota)}
    backoffs = {(b["zone"], b["type"]): b for b in report["backoffs"]}
    failures = {(f["zone"], f["type"]): f for f in report.get("last_failures", [])}
    dropped = {(d["zone"], d["type"]): d for d in report["dropped"]}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in fleet.tpus:
        if entry.existing:
            continue  # a node the user brought: never claimed
        for zone in entry.zones:
            key = (zone, entry.type)
            if key in rows:
                continue
            q = quota.of(zone, entry.accelerator, entry.provisioning_model)
            racing = sorted(short_node_name(q["name"]) for q in report["queued_resources"]
                            if q["zone"] == zone and q["type"] == entry.type and q["state"] in QR_STATES_RACING)
            b, d = backoffs.get(key), dropped.get(key)
            row: dict[str, Any] = {
                "zone": zone, "type": entry.type, "tier": entry.provisioning_model.value,
                "quota_chips": q.bound if q else None,  # the zone's or its region's, whichever is fewer
                "quota_unlimited": bool(q and q.is_unlimited),  # Cloud Quotas said -1: no bound at all
                "quota_source": quota_source(q),
                "quota_detail": q.describe() if q else None,
                "skipped": skipped.get(key),
                "racing": racing,
                "backoff_until": b["until"] if b else None,
                "backoff_until_local": local_time(b["until"], tz, now) if b else None,
                "backoff_until_shown": local_time_until(b["until"], tz, now) if b else None,  # with "(in 23s)"
                "capacity_failures": b["failures"] if b else 0,
                # a stopped target (unknown error, external IP quota): its failures and the API's raw error
                "stopped_after": b["unknown_failures"] if b and b.get("failure_class") in STOPPING_FAILURES else 0,
                "stopped_error": b["reason"] if b and b.get("failure_class") in STOPPING_FAILURES else None,
                "last_error": failures[key]["message"] if key in failures else None,
                "dropped": d["reason"] if d else None,
                "dropped_detail": d.get("detail") if d else None,
            }
            row["note"] = target_note(row)
            rows[key] = row
    return list(rows.values())


def quota_source(q) -> str | None:
    """Where one zone's quota number came from, for people; None when nothing was checked."""
    from tpuq.capacity.quota import QuotaSource

    if q is None or (q.bound is None and not q.is_unlimited):
        return None
    return "Cloud Quotas API" if q.source is QuotaSource.api else "fleet file"


def backoff_shown(row: dict[str, Any]) -> str:
    """When a zone's back-off ends, and how far off that is: `14:03:27 CET (in 23s)`."""
    return row.get("backoff_until_shown") or row["backoff_until_local"]


def target_note(row: dict[str, Any]) -> str:
    """What holds one zone and type, for people; "" when nothing does."""
    if row["dropped"]:
        return f"dropped: {row['dropped']}"
    if row["skipped"]:
        return f"skipped: {row['skipped']}"
    if row["backoff_until"] and row["stopped_error"]:
        return (f"stopped until {backoff_shown(row)} after {row['stopped_after']} failure(s): "
                f"{row['stopped_error']}")
    if row["backoff_until"]:
        return f"backed off until {backoff_shown(row)} after {row['capacity_failures']} capacity failure(s)"
    return ""


def brakes_view(fleet: FleetFile, control: FleetControl, use: DayUse, now: datetime, tz: tzinfo) -> dict[str, Any]:
    """Paused, the day's VM-hours against the budget, the grant's days left, and the drain."""
    smallest = min((e.accelerator.hosts for e in fleet.tpus if not e.existing), default=1)
    stop = claim_stop_reason(fleet, control.paused, use, now, smallest)  # stopped: not even the smallest slice
    return {
        "claiming": "stopped" if stop else "on",
        "stopped": stop,
        "paused": control.paused,
        "paused_at": control.paused_at,
        "budget": None if fleet.budget is None else {
            "vm_hours_per_day": fleet.budget.vm_hours_per_day, "used_today": round(use.vm_hours, 2),
            "alive_hosts": use.alive_hosts, "day": day_start(now).date().isoformat()},
        "grant": None if fleet.grant_expires is None else {
            "expires": fleet.grant_expires.isoformat(), "days_left": max(grant_days_left(fleet, now) or 0, 0)},
        "drain": None if not control.drain_id else {
            "id": control.drain_id, "requested_at": control.drain_requested_at,
            "done": not control.drain_pending, "deleted": list(control.drain_deleted)},
        "tz": now.astimezone(tz).strftime("%Z"),
    }


def waiting_reason(job: dict[str, Any], views: list[dict[str, Any]], now: datetime, tz: tzinfo) -> str | None:
    """What holds a pending job, from the fleet views: "v4-8 in us-central2-b backed off until 14:03 CET;
    europe-west4-a dropped: no quota: ...", led by the zones it races in. None when nothing is known to hold it."""
    try:
        j = JobDoc.from_doc(job)
    except Permanent:
        return None  # an unreadable job: `tpuq status` says so itself
    if j.state != JobState.pending:
        return None
    spec = j.spec or {}
    any_type = [t.strip().lower() for t in j.spec_tpu] == [ANY_TPU]  # `tpu: any`: every type the fleet offers
    types = {canonical_name(t) for t in j.spec_tpu}
    zone = spec.get("zone")
    region = j.pinned_region
    held: list[str] = []
    racing: list[str] = []
    for view in views:
        rows = [r for r in view.get("targets", []) if (any_type or r["type"] in types) and (not zone or r["zone"] == zone)
                and (not region or zone_region(r["zone"]) == region)]
        if not rows:
            continue
        brakes = view.get("brakes") or {}
        if brakes.get("stopped"):
            held.append(f"claiming stopped: {brakes['stopped']}")
        held += [f"blocked: {b}" for b in view.get("blocked", [])]
        for r in rows:
            if r["racing"]:
                racing.append(f"{r['type']} in {r['zone']}")
            elif r["dropped"]:
                held.append(f"{r['zone']} dropped: {r['dropped']}")
            elif r["skipped"]:
                held.append(f"{r['zone']} skipped: {r['skipped']}")
            elif r["backoff_until"]:
                held.append(f"{r['type']} in {r['zone']} backed off until {backoff_shown(r)}")
    held += existing_problems(spec, views)
    if isinstance(j.not_before, datetime) and j.not_before > now:
        held.append(f"retry not before {local_time_until(j.not_before, tz, now)}")
    if racing:
        held.insert(0, "racing " + ", ".join(racing))
    return "; ".join(held) if held else None


def existing_problems(spec: dict[str, Any], views: list[dict[str, Any]]) -> list[str]:
    """Why the `existing:` nodes a job could run on are not used, with the command that fixes each: the job's
    `tpu_name` node, or any existing node of one of its types when it names none."""
    types = {canonical_name(t) for t in spec.get("tpu") or []}
    wanted = short_node_name(spec["tpu_name"]) if spec.get("tpu_name") else None
    out = []
    for view in views:
        for e in view.get("existing", []):
            if e.get("problem") and (e["node"] == wanted if wanted else e["type"] in types):
                out.append(f"{e['problem']}" + (f"; run: {e['fix']}" if e.get("fix") else ""))
    return out


def fleet_report(db, fleet_name: str, now: datetime | None = None) -> dict[str, Any]:
    """What the claimer knows about one fleet.

    {fleet, version, blocked, blocked_at, requests, queued_resources, backoffs, dropped}:

    `blocked` is a sentence for people ("billing is disabled on project X: ..."), or None.
    `dropped` lists only drops made under the fleet file in force (a changed file lifts them).
    """
    now = now or datetime.now(timezone.utc)
    fleet_snap = db.collection(store.FLEETS).document(fleet_name).get()
    version = (fleet_snap.to_dict() or {}).get("version") if fleet_snap.exists else None
    status_snap = db.collection(store.FLEET_STATUS).document(fleet_name).get()
    status = documents.status_from_doc(status_snap.to_dict()) if status_snap.exists else None
    blocked = status.blocked if status and (version is None or status.blocked_version == version) else None

    qrs = [documents.qr_from_doc(s.to_dict()) for s in
           db.collection(store.QUEUED_RESOURCES).where(filter=FieldFilter("fleet", "==", fleet_name)).where(filter=FieldFilter("live", "==", True))
           .stream()]
    requests = [documents.request_from_doc(s.to_dict()) for s in
                db.collection(store.REQUESTS).where(filter=FieldFilter("fleet", "==", fleet_name))
                .where(filter=FieldFilter("status", "==", RequestStatus.open)).stream()]
    targets = [documents.target_from_doc(s.to_dict(), s.update_time) for s in
               db.collection(store.ZONES).where(filter=FieldFilter("fleet", "==", fleet_name)).stream()]
    existing = sorted((s.to_dict() for s in db.collection(store.EXISTING_TPUS)
                       .where(filter=FieldFilter("fleet", "==", fleet_name)).stream()), key=lambda e: e["entry_id"])
    return {
        "fleet": fleet_name,
        "version": version,
        "blocked": blocked,
        "existing": [{k: e.get(k) for k in ("entry_id", "node", "usable", "problem", "fix")} for e in existing],
        "blocked_at": status.blocked_at if blocked and status else None,
        "blocked_detail": status.blocked_message if blocked and status else None,  # the API's own error
        "requests": [
            {
                "request_id": r.request_id,
                "types": list(r.types),
                "count": r.count,
                "job_ids": list(r.job_ids),
                "active": sum(1 for q in qrs if q.request_id == r.request_id and q.state == QueuedResourceState.ACTIVE),
                "racing": sorted(q.zone for q in qrs if q.request_id == r.request_id and q.pending),
            }
            for r in sorted(requests, key=lambda r: r.request_id)
        ],
        "queued_resources": [
            {
                "name": q.name,
                "request_id": q.request_id,
                "zone": q.zone,
                "type": q.type,
                "state": q.state,
                "node": q.node,
                "delete_requested": q.delete_requested,
                "failure_class": q.failure_class,
                "failure_message": q.failure_message,
                "updated_at": q.updated_at,
            }
            for q in sorted(qrs, key=lambda q: q.qr_id)
        ],
        "backoffs": [
            {"zone": t.zone, "type": t.type, "until": t.backoff_until, "failures": t.capacity_failures,
             "unknown_failures": t.unknown_failures, "failure_class": t.last_failure_class,
             "reason": t.last_failure_message}
            for t in sorted(targets, key=lambda t: (t.zone, t.type))
            if t.backoff_until is not None and t.backoff_until > now
        ],
        "last_failures": [
            {"zone": t.zone, "type": t.type, "class": t.last_failure_class, "message": t.last_failure_message}
            for t in sorted(targets, key=lambda t: (t.zone, t.type)) if t.last_failure_message
        ],
        "dropped": [
            {"zone": t.zone, "type": t.type, "reason": t.dropped_reason, "detail": t.last_failure_message}
            for t in sorted(targets, key=lambda t: (t.zone, t.type))
            if t.dropped_version is not None and (version is None or t.dropped_version == version)
        ],
    }


def job_counts(db) -> dict[str, int]:
    """How many stored jobs are in each state (Firestore `count()` aggregations, one per state)."""
    counts = {}
    for state in JobState:
        query = db.collection(store.JOBS).where(filter=FieldFilter("state", "==", state.value))
        counts[state.value] = int(query.count().get()[0][0].value)
    return counts


def status_overview(db, now: datetime, tz: tzinfo) -> dict[str, Any]:
    """`tpuq status` without a job, like tpu-runner's `status --deployment`: per stored fleet its entries, its
    TPUs and queued resources by state and what blocks it (from `fleet_view`'s model), and the queue by state."""
    fleets = []
    for view in all_fleet_views(db, now, tz):
        fleet = load_fleet(db, view["fleet"])
        tpus: dict[str, int] = {}
        for t in view["tpus"]:
            tpus[t.get("state") or "unknown"] = tpus.get(t.get("state") or "unknown", 0) + 1
        qrs: dict[str, int] = {}
        for q in view["queued_resources"]:
            qrs[q.get("state") or "unknown"] = qrs.get(q.get("state") or "unknown", 0) + 1
        brakes = view["brakes"]
        blocked = list(view["blocked"]) + ([f"claiming stopped: {brakes['stopped']}"] if brakes.get("stopped") else [])
        details = list(view.get("blocked_details", [])) + ([""] if brakes.get("stopped") else [])
        fleets.append({
            "fleet": view["fleet"],
            "project": fleet.project,
            "entries": [{"id": e.id, "type": e.type, "zones": list(e.zones), "count": e.count,
                         "keep_warm_count": e.keep_warm_count, "provisioning_model": e.provisioning_model.value,
                         "existing": e.existing} for e in fleet.tpus],
            "tpus": dict(sorted(tpus.items())),
            "queued_resources": dict(sorted(qrs.items())),
            "requests_open": len(view["requests"]),
            "blocked": blocked,
            "blocked_details": details,
            "zones": view["zones"],
            "paused": brakes.get("paused", False),
        })
    return {"generated_at": now, "fleets": fleets, "jobs": job_counts(db),
            "unheld_jobs": unheld_jobs(db, now)}
