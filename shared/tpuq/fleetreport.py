"""`tpuq fleet`: the claimer's view (queued resources, back-offs, drops, blocked) plus the TPUs the scheduler holds.

Read-only, through the documents' typed views (`tpuq.documents`): nothing here imports a service.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from tpuq import documents, store
from tpuq.documents import QueuedResourceState, RequestStatus, TpuState, short_node_name
from tpuq.messages import FailureClass
from tpuq.fleetstore import load_fleet
from tpuq.queries import age


def fleet_view(db, name: str | None, now: datetime) -> dict[str, Any]:
    fleet = load_fleet(db, name)
    report = fleet_report(db, fleet.name, now)
    notes = {}
    for q in report["queued_resources"]:
        note = q.get("failure_class") or ""
        if q.get("delete_requested"):
            note = (note + " delete requested").strip()
        notes[q["name"]] = note
    tpus = []
    for snap in db.collection(store.TPUS).where("fleet", "==", fleet.name).stream():
        t = snap.to_dict()
        if t.get("state") == TpuState.gone:
            continue
        t["idle_for"] = age(t.get("idle_since"), now) if t.get("state") == TpuState.idle else ""
        tpus.append(t)
    zones = [{"key": f"{b['zone']} {b['type']}", "note": _backoff_note(b)} for b in report["backoffs"]]
    zones += [{"key": f"{d['zone']} {d['type']}", "note": f"dropped: {d['reason']}"} for d in report["dropped"]]
    return {
        "fleet": fleet.name,
        "version": report["version"],
        "blocked": [report["blocked"]] if report["blocked"] else [],
        "requests": report["requests"],
        "queued_resources": [
            {**q, "name": short_node_name(q["name"]), "note": notes.get(q["name"], "")}
            for q in report["queued_resources"]
        ],
        "tpus": sorted(tpus, key=lambda t: t.get("short", "")),
        "zones": zones,
    }


def _backoff_note(b: dict[str, Any]) -> str:
    """A capacity back-off says how many stockouts; a stopped target (unknown error, external IP quota) shows
    the API's raw error, which says what to do."""
    if b.get("failure_class") in (FailureClass.unknown, FailureClass.external_ip_quota):
        return f"stopped until {b['until']:%H:%M:%S} after {b['unknown_failures']} failure(s): {b['reason']}"
    return f"backing off until {b['until']:%H:%M:%S} after {b['failures']} capacity failure(s)"


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
    return {
        "fleet": fleet_name,
        "version": version,
        "blocked": blocked,
        "blocked_at": status.blocked_at if blocked and status else None,
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
        "dropped": [
            {"zone": t.zone, "type": t.type, "reason": t.dropped_reason}
            for t in sorted(targets, key=lambda t: (t.zone, t.type))
            if t.dropped_version is not None and (version is None or t.dropped_version == version)
        ],
    }
