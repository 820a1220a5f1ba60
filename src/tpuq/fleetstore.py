"""The fleet file in force, kept in Firestore `fleets/{name}` so every service reads the same one.

`tpuq dev up --fleet FILE`, `tpuq fleet apply FILE` and `tpuq deploy` write it;
services read it per message (one ~2.5 ms document read), so a changed fleet
takes effect at once. `version` is a content hash: state tied to one fleet file
(a zone dropped for quota) resets when the file changes.
"""

from __future__ import annotations

import os
from datetime import datetime

from tpuq import store
from tpuq.errors import Permanent, Retryable
from tpuq.fleet import FleetFile

ENV_FLEET = "TPUQ_FLEET"


def save_fleet(db, fleet: FleetFile, now: datetime) -> str:
    db.collection(store.FLEETS).document(fleet.name).set(
        {"name": fleet.name, "fleet": fleet.model_dump(mode="json"), "version": fleet.version, "updated_at": now}
    )
    return fleet.version


def load_fleet(db, name: str | None = None) -> FleetFile:
    """The named fleet, else $TPUQ_FLEET, else the only fleet stored."""
    name = name or os.environ.get(ENV_FLEET)
    col = db.collection(store.FLEETS)
    if name:
        snap = col.document(name).get()
        if not snap.exists:
            raise Retryable(f"fleet {name!r} is not stored yet (tpuq fleet apply FILE)")
        return FleetFile.model_validate(snap.to_dict()["fleet"])
    docs = list(col.limit(2).stream())
    if not docs:
        raise Retryable("no fleet is stored yet (tpuq fleet apply FILE)")
    if len(docs) > 1:
        raise Permanent(f"several fleets are stored; set {ENV_FLEET} to choose one")
    return FleetFile.model_validate(docs[0].to_dict()["fleet"])
