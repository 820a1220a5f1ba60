"""What the claimer knows about one fleet, for `tpuq fleet` and the status of every waiting job."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from tpuq import store
from tpuq.claimer import statestore
from tpuq.claimer.model import REQUEST_OPEN


def fleet_report(db, fleet_name: str, now: datetime | None = None) -> dict[str, Any]:
    """{fleet, version, blocked, blocked_at, requests, queued_resources, backoffs, dropped}.

    `blocked` is a sentence for people ("billing is disabled on project X: ..."), or None.
    `dropped` lists only drops made under the fleet file in force (a changed file lifts them).
    """
    now = now or datetime.now(timezone.utc)
    fleet_snap = db.collection(store.FLEETS).document(fleet_name).get()
    version = (fleet_snap.to_dict() or {}).get("version") if fleet_snap.exists else None
    status_snap = db.collection(statestore.FLEET_STATUS).document(fleet_name).get()
    status = statestore.status_from_doc(status_snap.to_dict()) if status_snap.exists else None
    blocked = status.blocked if status and (version is None or status.blocked_version == version) else None

    qrs = [statestore.qr_from_doc(s.to_dict()) for s in
           db.collection(statestore.QUEUED_RESOURCES).where(filter=FieldFilter("fleet", "==", fleet_name)).where(filter=FieldFilter("live", "==", True))
           .stream()]
    requests = [statestore.request_from_doc(s.to_dict()) for s in
                db.collection(store.REQUESTS).where(filter=FieldFilter("fleet", "==", fleet_name))
                .where(filter=FieldFilter("status", "==", REQUEST_OPEN)).stream()]
    targets = [statestore.target_from_doc(s.to_dict(), s.update_time) for s in
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
                "active": sum(1 for q in qrs if q.request_id == r.request_id and q.state == "ACTIVE"),
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
