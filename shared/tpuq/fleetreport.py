"""`tpuq fleet`: the claimer's view (queued resources, back-offs, drops, blocked) plus the TPUs the scheduler holds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tpuq import store
from tpuq.claimer.report import fleet_report
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
        if t.get("state") == "gone":
            continue
        t["idle_for"] = age(t.get("idle_since"), now) if t.get("state") == "idle" else ""
        tpus.append(t)
    zones = [{"key": f"{b['zone']} {b['type']}", "note": f"backing off until {b['until']:%H:%M:%S} "
              f"after {b['failures']} capacity failure(s)"} for b in report["backoffs"]]
    zones += [{"key": f"{d['zone']} {d['type']}", "note": f"dropped: {d['reason']}"} for d in report["dropped"]]
    return {
        "fleet": fleet.name,
        "version": report["version"],
        "blocked": [report["blocked"]] if report["blocked"] else [],
        "requests": report["requests"],
        "queued_resources": [
            {**q, "name": q["name"].rsplit("/", 1)[-1], "note": notes.get(q["name"], "")}
            for q in report["queued_resources"]
        ],
        "tpus": sorted(tpus, key=lambda t: t.get("short", "")),
        "zones": zones,
    }
