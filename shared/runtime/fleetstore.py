"""The fleet file in force, kept in Firestore `fleets/{name}` so every service reads the same one.

`tpuq dev up --fleet FILE`, `tpuq fleet apply FILE` and `tpuq deploy` write it;
services read it per message (one ~2.5 ms document read), so a changed fleet
takes effect at once. `version` is a content hash: state tied to one fleet file
(a zone dropped for quota) resets when the file changes.

Beside it, `fleet_control/{name}` (`FleetControl`) holds what a person switches at run time and no fleet file
says: paused (`tpuq fleet pause` / `resume`) and a drain asked for (`tpuq fleet drain --now`), with the janitor's
record of the drain it finished. It is a separate document so that `tpuq fleet apply` never un-pauses a fleet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpuq.contracts import store
from tpuq.contracts.errors import Permanent, Retryable
from tpuq.runtime import tickdue
from tpuq.runtime.guarded import LOST_RACE
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.notify import refuse_inline_urls
from tpuq.runtime.settings import ENV_FLEET

def save_fleet(db, fleet: FleetFile, now: datetime) -> str:
    """Store the fleet in force. Its `notify` must name secrets only (`tpuq fleet apply` stores inline URLs in
    Secret Manager first): a webhook URL is a credential and never lands in Firestore."""
    refuse_inline_urls(fleet.notify, "notify")
    db.collection(store.FLEETS).document(fleet.name).set(
        {"name": fleet.name, "fleet": fleet.model_dump(mode="json"), "version": fleet.version, "updated_at": now}
    )
    return fleet.version


_PARSED: dict[tuple, FleetFile] = {}
_PARSED_MAX = 64


def fleet_of(snap) -> FleetFile:
    """A stored `fleets/{name}` document's FleetFile. Services read it per message; the parse is kept per version
    of the document (its update time, and the stored version, the file's content hash, checked against the parse;
    FleetFile is frozen, so one parse can serve every reader)."""
    version = _field(snap, "version")
    key = (snap.id, getattr(snap, "update_time", None), version)  # any write to the document reads it afresh
    fleet = _PARSED.get(key) if version else None
    if fleet is None:
        fleet = FleetFile.model_validate(snap.to_dict()["fleet"])
        if version and fleet.version == version:  # a version written by hand is not trusted as a key
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[key] = fleet
    return fleet


def _field(snap, name: str):
    """One field, not the whole document's copy (a snapshot without `get`, a test's stand-in: from its map)."""
    if not hasattr(snap, "get"):
        return (snap.to_dict() or {}).get(name)
    try:
        return snap.get(name)
    except KeyError:
        return None


def fleet_or_none(db, name: str | None = None) -> FleetFile | None:
    """`load_fleet`, or None before any fleet is stored (said in the log): jobs are still queued and matched,
    nothing is claimed, nobody is notified."""
    try:
        return load_fleet(db, name)
    except Retryable as e:
        logging.getLogger("tpuq.fleetstore").warning("%s", e)
        return None


def load_fleet(db, name: str | None = None) -> FleetFile:
    """The named fleet (a service passes its `Settings.fleet`, $TPUQ_FLEET), else the only fleet stored."""
    col = db.collection(store.FLEETS)
    if name:
        snap = col.document(name).get()
        if not snap.exists:
            raise Retryable(f"fleet {name!r} is not stored yet (tpuq fleet apply FILE)")
        return fleet_of(snap)
    docs = list(col.limit(2).stream())
    if not docs:
        raise Retryable("no fleet is stored yet (tpuq fleet apply FILE)")
    if len(docs) > 1:
        raise Permanent(f"several fleets are stored; set {ENV_FLEET} to choose one")
    return fleet_of(docs[0])


@dataclass(frozen=True)
class FleetControl:
    """fleet_control/{fleet}: the brakes a person pulls. Absent document: running, no drain."""

    fleet: str
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    drain_id: str | None = None  # the drain asked for last (`tpuq fleet drain --now`)
    drain_requested_at: datetime | None = None
    drain_done_id: str | None = None  # the drain the janitor finished (== drain_id: nothing owned is left)
    drain_done_at: datetime | None = None
    drain_deleted: tuple[str, ...] = field(default=())  # what the janitor deleted for drain_id

    @property
    def drain_pending(self) -> bool:
        return bool(self.drain_id) and self.drain_done_id != self.drain_id

    @classmethod
    def from_doc(cls, fleet: str, doc: dict[str, Any] | None) -> "FleetControl":
        doc = doc or {}
        return cls(fleet=fleet, paused=bool(doc.get("paused")), paused_at=doc.get("paused_at"),
                   paused_by=doc.get("paused_by"), drain_id=doc.get("drain_id"),
                   drain_requested_at=doc.get("drain_requested_at"), drain_done_id=doc.get("drain_done_id"),
                   drain_done_at=doc.get("drain_done_at"), drain_deleted=tuple(doc.get("drain_deleted") or ()))


def control_ref(db, fleet: str):
    return db.collection(store.FLEET_CONTROL).document(fleet)


def load_control(db, fleet: str) -> FleetControl:
    snap = control_ref(db, fleet).get()
    return FleetControl.from_doc(fleet, snap.to_dict() if snap.exists else None)


def paused_fleets(db) -> set[str]:
    """The names of the paused fleets (one small collection, a document per fleet)."""
    return {s.id for s in db.collection(store.FLEET_CONTROL).stream() if (s.to_dict() or {}).get("paused")}


def set_paused(db, fleet: str, paused: bool, now: datetime, by: str | None = None) -> None:
    fields: dict[str, Any] = {"fleet": fleet, "paused": paused, "updated_at": now}
    if paused:
        fields |= {"paused_at": now, "paused_by": by}
    _with_janitor_due(db, control_ref(db, fleet), fields)


def _with_janitor_due(db, ref, fields: dict[str, Any]) -> None:
    """A control change, and the janitor's tick work due from now (`tpuq.runtime.tickdue`), in one commit: what
    the change asks (idle TPUs deleted at once, a drain) is done by the next tick even if its nudge is lost."""
    batch = db.batch()
    batch.set(ref, fields, merge=True)
    tickdue.wake_janitor(batch, db)
    batch.commit()


def request_drain(db, fleet: str, drain_id: str, now: datetime, by: str | None = None) -> None:
    """Pause, and ask the janitor to delete everything tpuq owns in the fleet (it records `drain_done_id`)."""
    _with_janitor_due(db, control_ref(db, fleet), {"fleet": fleet, "paused": True, "paused_at": now, "paused_by": by,
                                                   "drain_id": drain_id, "drain_requested_at": now,
                                                   "drain_deleted": [], "updated_at": now})


def record_drain_progress(db, fleet: str, drain_id: str, deleted: list[str], done: bool, now: datetime) -> None:
    """The janitor's record: names it deleted for `drain_id` (added to, across passes), and whether it is done.
    Written only while `drain_id` is still the drain asked for (a newer drain is not marked done by an old one)."""
    from google.cloud import firestore

    ref = control_ref(db, fleet)
    snap = ref.get()
    if not snap.exists or (snap.to_dict() or {}).get("drain_id") != drain_id:
        return
    fields: dict[str, Any] = {"updated_at": now}
    if deleted:
        fields["drain_deleted"] = firestore.ArrayUnion(list(deleted))
    if done:
        fields |= {"drain_done_id": drain_id, "drain_done_at": now}
    try:
        ref.update(fields, option=db.write_option(last_update_time=snap.update_time))
    except LOST_RACE:
        pass  # a person asked again meanwhile, or another janitor wrote first: the next pass records it
