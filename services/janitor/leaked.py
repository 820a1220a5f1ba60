"""The janitor's notification (issue 36 §3, tpuq.contracts.notify): an owned resource found leaked. Core (pure), then
the shell's one call.

The orphan scan (`decide.decide_orphans`) deletes a resource that carries the fleet's owner labels but that no
Firestore document names, once it has seen it for `orphan_grace_seconds`. Each such resource is told of under an
event id of its name, to the fleet file's destinations that opted in to `leaked`. It is published just before the
delete is sent: the scan that sends it again after a crash (the resource still listed) publishes the same id, which
the sender delivers once; after the delete no scan finds it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.notify import Notification, NotifyEvent, destinations_for, event_id
from tpuq.janitor.decide import Delete, is_queued_resource, state_of

log = logging.getLogger("tpuq.janitor")


def _zone(name: str) -> str:
    parts = name.split("/")
    return parts[3] if len(parts) > 3 and parts[2] == "locations" else ""


def leaked_notices(fleet: FleetFile, deletes: Iterable[Delete], now: datetime) -> list[Notification]:
    """One notice per leaked resource the scan deletes (none when no destination asked)."""
    destinations = destinations_for(NotifyEvent.leaked, None, fleet.notify)
    if not destinations:
        return []
    out = []
    for delete in deletes:
        kind = "queued resource" if is_queued_resource(delete.resource) else "node"
        short = delete.name.rsplit("/", 1)[-1]
        zone = _zone(delete.name)
        text = (f"{kind} {delete.name} carries fleet {fleet.name}'s owner labels but no tpuq record names it (seen for "
                f"{fleet.claim.orphan_grace_seconds:g}s or more): deleted. A crash between a create and its record, "
                "or a record removed by hand, leaves one.")
        out.append(Notification(
            event_id=event_id(NotifyEvent.leaked, fleet.name, delete.name), event=NotifyEvent.leaked,
            subject=fleet.name, title=f"fleet {fleet.name}: leaked {kind} {short}" + (f" in {zone}" if zone else ""),
            text=text, fields={"fleet": fleet.name, "resource": delete.name, "zone": zone,
                               "state": str(state_of(delete.resource) or "")},
            destinations=destinations, at=now))
    return out


def tell(ctx, fleet: FleetFile, deletes: list[Delete]) -> None:
    for notice in leaked_notices(fleet, deletes, ctx.now()):
        ctx.publish("notifications", notice, event=notice.event.value)
        log.info("notification %s to %d destination(s)", notice.event_id, len(notice.destinations))
