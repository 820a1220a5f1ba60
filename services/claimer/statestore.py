"""Shell (Firestore): the claimer's documents. Load a fleet's `ClaimState`, write its updates, claim a zone.

The documents' shapes (typed views and their conversions) are `tpuq.contracts.documents`'.

Documents (none hot: each is written only when its own entity changes):
- requests/{request_id}            one capacity request: types, count, status, generations per zone
- queued_resources/{qr_id}         one queued resource we created, with the last state seen (`live` until GONE);
                                   every write `stamped` (`written_at`): a load reads only those written since
                                   the instance's last read (`FleetViews`)
- zones/{fleet}:{zone}:{type}      a race target: back-off, drop (keyed on fleet version), unknown-error count;
                                   every write `stamped`, read as queued resources are (`FleetViews`)
- fleet_status/{fleet}             `blocked`: why the fleet may not create anywhere (billing, permission)
- existing_tpus/{fleet}:{entry}     an `existing:` node's last read: usable, or the problem and its fix
- fleet_control/{fleet}, tpus/     read only: paused, and the day's VM-hours for the budget (`tpuq.capacity.brakes`)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from tpuq.runtime import guarded

from tpuq.contracts import store
from tpuq.capacity.brakes import DayUse, day_use
from tpuq.claimer.model import REQUEST_OPEN, ClaimState
from tpuq.contracts.documents import (
    FleetStatus,
    QrRecord,
    RequestRecord,
    TargetRecord,
    qr_from_doc,
    qr_to_doc,
    request_from_doc,
    request_to_doc,
    status_from_doc,
    status_to_doc,
    target_from_doc,
    target_to_doc,
)
from tpuq.capacity.existing import ExistingStatus
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.deltaread import DeltaView, stamped
from tpuq.runtime.fleetstore import load_control
from tpuq.runtime.versioned import versioned

QUEUED_RESOURCES = store.QUEUED_RESOURCES
FLEET_STATUS = store.FLEET_STATUS


def target_doc_id(fleet: str, zone: str, tpu_type: str) -> str:
    return store.doc_id(fleet, zone, tpu_type)


# ------------------------------------------------------------ load

def load_state(db, fleet: FleetFile, request_ids: tuple[str, ...] = (), now: datetime | None = None,
               open_requests: dict[str, RequestRecord] | None = None, views: FleetViews | None = None) -> ClaimState:
    """The fleet's targets, live queued resources, open requests (+ the named ones, whatever their status).

    Targets are read before queued resources: a zone claim conditioned on the target's version then
    fails if another handler created a queued resource after this load. `open_requests`: already read (a tick's
    `load_open_requests`), not read again. `views`: the instance's views of the fleet's targets and live queued
    resources (`FleetViews`; None: both queried whole).
    """
    targets = {}
    target_snaps = (views.targets.read(db, now) if views is not None and now is not None
                    else _fleet_targets(db, fleet.name).stream())
    for snap in target_snaps:
        t = target_from_doc(snap.to_dict(), snap.update_time)
        targets[(t.zone, t.type)] = t
    qrs = {}
    kept_qrs = versioned(db, "claimer queued resource", _qr_of)  # each stored version parsed once
    for snap in _live_qr_snaps(db, fleet.name, views, now):
        q = kept_qrs.get(snap)[1]
        qrs[q.qr_id] = q
    requests = dict(open_requests) if open_requests is not None else load_open_requests(db, fleet)
    for rid in request_ids:
        snap = db.collection(store.REQUESTS).document(rid).get()
        if snap.exists:
            requests[rid] = request_from_doc(snap.to_dict())
    status_snap = db.collection(FLEET_STATUS).document(fleet.name).get()
    status = status_from_doc(status_snap.to_dict()) if status_snap.exists else None
    paused, use = load_brakes(db, fleet, now)
    return ClaimState(fleet=fleet, requests=requests, qrs=qrs, targets=targets, status=status, paused=paused,
                      day_use=use)


def load_open_requests(db, fleet: FleetFile) -> dict[str, RequestRecord]:
    """The fleet's open requests: a tick's first read (none open: one read). With one open, the tick goes on to
    `load_state(..., open_requests=...)`, which then does not read them again."""
    kept = versioned(db, "claimer request", _request_of)
    return {r.request_id: r for r in (kept.get(snap)[1] for snap in _open_requests(db, fleet.name))}


def load_live_qrs(db, fleet: FleetFile, views: FleetViews | None = None,
                  now: datetime | None = None) -> dict[str, QrRecord]:
    """The fleet's live queued resources (none: one read): all a tick with no open request needs to watch them."""
    kept = versioned(db, "claimer queued resource", _qr_of)
    return {q.qr_id: q for q in (kept.get(snap)[1] for snap in _live_qr_snaps(db, fleet.name, views, now))}


@dataclass(frozen=True)
class FleetViews:
    """An instance's views of a fleet's race targets and live queued resources (`tpuq.runtime.deltaread`): a
    load reads those written since the instance's last read (every write of both is `stamped`: here, and
    `tpuq fleet retry`'s), all of them again on `full_every` and after `forget`."""

    targets: DeltaView
    qrs: DeltaView

    @classmethod
    def of(cls, fleet: str, full_every: timedelta) -> "FleetViews":
        return cls(targets=DeltaView(scope=lambda db: _fleet_targets(db, fleet), keep=lambda doc: True,
                                     full_every=full_every),
                   qrs=DeltaView(scope=lambda db: _fleet_qrs(db, fleet), keep=lambda doc: doc.get("live") is True,
                                 full_every=full_every, whole=lambda db: _live_qrs(db, fleet)))

    def forget(self) -> None:
        self.targets.forget()
        self.qrs.forget()


def _live_qr_snaps(db, fleet: str, views: FleetViews | None, now: datetime | None):
    if views is None or now is None:
        return _live_qrs(db, fleet).stream()
    return views.qrs.read(db, now)


def _fleet_targets(db, fleet: str):
    return db.collection(store.ZONES).where(filter=FieldFilter("fleet", "==", fleet))


def _fleet_qrs(db, fleet: str):
    return db.collection(QUEUED_RESOURCES).where(filter=FieldFilter("fleet", "==", fleet))


def _live_qrs(db, fleet: str):
    return _fleet_qrs(db, fleet).where(filter=FieldFilter("live", "==", True))


def _open_requests(db, fleet: str):
    return (db.collection(store.REQUESTS).where(filter=FieldFilter("fleet", "==", fleet))
            .where(filter=FieldFilter("status", "==", REQUEST_OPEN)).stream())


def _qr_of(doc_id: str, doc: dict) -> QrRecord:
    return qr_from_doc(doc)


def _request_of(doc_id: str, doc: dict) -> RequestRecord:
    return request_from_doc(doc)


def load_brakes(db, fleet: FleetFile, now: datetime | None) -> tuple[bool, DayUse]:
    """Paused (fleet_control/), and the day's VM-hours from tpus/ (read only when the fleet has a budget)."""
    paused = load_control(db, fleet.name).paused
    if fleet.budget is None or now is None:
        return paused, DayUse()
    tpus = (s.to_dict() for s in db.collection(store.TPUS).where(filter=FieldFilter("fleet", "==", fleet.name)).stream())
    return paused, day_use(tpus, fleet.name, now)


# ------------------------------------------------------------ write

class StateWriter:
    """Writes state updates; remembers each target's latest version for the zone claims that follow."""

    def __init__(self, db):
        self.db = db
        self.target_versions: dict[tuple[str, str], Any] = {}
        self.opened = False  # an open request or a new queued resource was written: the tick mark must say busy

    def put_qr(self, qr: QrRecord) -> None:
        self.db.collection(QUEUED_RESOURCES).document(qr.qr_id).set(stamped(qr_to_doc(qr)))

    def put_request(self, request: RequestRecord) -> None:
        self.opened = self.opened or request.status == REQUEST_OPEN
        self.db.collection(store.REQUESTS).document(request.request_id).set(request_to_doc(request))

    def put_status(self, status: FleetStatus) -> None:
        self.db.collection(FLEET_STATUS).document(status.fleet).set(status_to_doc(status))

    def put_existing(self, fleet: str, status: ExistingStatus, now: datetime) -> None:
        ref = self.db.collection(store.EXISTING_TPUS).document(store.doc_id(fleet, status.entry_id))
        ref.set(status.to_doc(fleet, now))

    def put_target(self, target: TargetRecord) -> None:
        ref = self.db.collection(store.ZONES).document(target_doc_id(target.fleet, target.zone, target.type))
        result = ref.set(stamped(target_to_doc(target)), merge=True)
        self.target_versions[(target.zone, target.type)] = result.update_time

    def claim_and_record(self, state: ClaimState, qr: QrRecord) -> bool:
        """Atomically: take the (zone, type) slot (conditioned on the target version this decision saw) and
        record the queued resource as REQUESTED. False: another handler changed the target meanwhile."""
        key = (qr.zone, qr.type)
        target = state.target(qr.zone, qr.type)
        version = self.target_versions.get(key, target.update_time)
        ref = self.db.collection(store.ZONES).document(target_doc_id(qr.fleet, qr.zone, qr.type))
        claim = stamped({"last_claim": qr.qr_id, "last_claim_at": qr.created_at})
        writes = guarded.WriteSet().update(guarded.Seen(ref, version),
                                           claim if version is not None else {**target_to_doc(target), **claim})
        writes.replace(self.db.collection(QUEUED_RESOURCES).document(qr.qr_id), stamped(qr_to_doc(qr)))
        results = guarded.commit_guarded(self.db, writes)
        if results is None:
            return False
        self.opened = True  # a new live queued resource
        self.target_versions[key] = results[0].update_time
        return True


