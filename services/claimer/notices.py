"""The claimer's notifications (issue 36 §3, tpuq.contracts.notify): the fleet blocked (billing, permission, the API
disabled...), the day's VM-hour budget reached, the grant's end near. Core (pure) first, then the shell.

Each goes to the fleet file's destinations that opted in, under an event id derived from what happened (the block's
class and when it began; the UTC day; the days left), so that every instance and redelivery names it alike and the
sender delivers it once. What a claimer instance told is kept in memory (`told`): each event is published once per
instance, not on every tick, with no read or write for it; a new instance may publish it again (deduplicated).
- blocked: published after the status is written (`after_status`); a crash in between is covered by the next
  message that loads the blocked status within BLOCKED_RETELL of its start (`after_load`).
- budget: when the loaded day's use leaves no room for the fleet's smallest slice (what `tpuq fleet` shows as
  "claiming stopped: over budget").
- grant_end: on each tick's fleet, GRANT_WARNINGS days before the grant's last day ends, and when it has ended.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from tpuq.capacity.brakes import DayUse, budget_allows, claim_stop_reason, day_start, grant_days_left
from tpuq.claimer.classify import block_kind
from tpuq.contracts.documents import FleetStatus
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.notify import MAX_TEXT, Notification, NotifyEvent, destinations_for, event_id

log = logging.getLogger("tpuq.claimer")

BLOCKED_RETELL = timedelta(minutes=10)  # Pub/Sub redelivers a failed push within minutes (backoff up to 600 s)
GRANT_WARNINGS = (7, 1)  # days left (today included) at which the grant's end is told of; and 0: it ended
MAX_TOLD = 1000  # events an instance remembers having told (then it forgets them all: at worst told again)


def _notice(fleet: FleetFile, event: NotifyEvent, parts: tuple, title: str, text: str, now: datetime,
            fields: dict[str, str]) -> Notification | None:
    destinations = destinations_for(event, None, fleet.notify)
    if not destinations:
        return None
    return Notification(event_id=event_id(event, fleet.name, *parts), event=event, subject=fleet.name,
                        title=title[:300], text=text[:MAX_TEXT], fields={"fleet": fleet.name, **fields},
                        destinations=destinations, at=now)


def blocked_notice(fleet: FleetFile, status: FleetStatus | None, now: datetime) -> Notification | None:
    """The fleet's project refuses new TPUs (fleet_status/{fleet}, in force for this fleet version)."""
    if status is None or not status.is_blocked(fleet.version) or status.blocked_at is None:
        return None
    kind = block_kind(status.blocked_message).value
    since = status.blocked_at.strftime("%Y%m%dT%H%M%SZ")
    return _notice(fleet, NotifyEvent.blocked, (kind, since), f"fleet {fleet.name} is blocked ({kind}): no TPU "
                   "can be claimed", str(status.blocked), now, {"class": kind, "project": fleet.project})


def budget_notice(fleet: FleetFile, use: DayUse, now: datetime) -> Notification | None:
    """The day's VM-hours leave no room for one more slice of the fleet's smallest type (claiming stops)."""
    if fleet.budget is None:
        return None
    smallest = min((e.accelerator.hosts for e in fleet.tpus if not e.existing), default=1)
    if budget_allows(fleet, use, smallest):
        return None
    day = day_start(now).date().isoformat()
    why = claim_stop_reason(fleet, False, use, now, smallest) or ""
    return _notice(fleet, NotifyEvent.budget, (day,), f"fleet {fleet.name}: the daily budget of "
                   f"{fleet.budget.vm_hours_per_day:g} VM-hours is reached", why, now,
                   {"day": day, "used_vm_hours": f"{use.vm_hours:.1f}", "alive_hosts": str(use.alive_hosts)})


def grant_mark(days_left: int | None) -> int | None:
    """Which warning `days_left` falls under: the smallest of GRANT_WARNINGS at or above it, 0 once ended."""
    if days_left is None:
        return None
    if days_left <= 0:
        return 0
    return min((w for w in GRANT_WARNINGS if days_left <= w), default=None)


def grant_notice(fleet: FleetFile, now: datetime) -> Notification | None:
    left = grant_days_left(fleet, now)
    mark = grant_mark(left)
    if mark is None or fleet.grant_expires is None or left is None:
        return None
    last = fleet.grant_expires.isoformat()
    if mark == 0:
        title, text = f"fleet {fleet.name}: the grant ended on {last}", "nothing more is claimed (grant_expires)"
    else:
        when = "today is its last day" if left == 1 else f"{left} days left, the last on {last}"
        title = f"fleet {fleet.name}: the grant ends soon ({when})"
        text = f"from {fleet.grant_expires + timedelta(days=1)} (UTC) nothing is claimed; renew it or move the work"
    return _notice(fleet, NotifyEvent.grant_end, (mark,), title, text, now, {"expires": last, "days_left": str(left)})


# ----------------------------------------------------------------------------------------------------- shell


def tell(ctx, notice: Notification | None, told: set[str]) -> None:
    """Publish `notice` unless this instance already did (`told`: the instance's memory)."""
    if notice is None or notice.event_id in told:
        return
    ctx.publish("notifications", notice, event=notice.event.value)
    log.info("notification %s to %d destination(s)", notice.event_id, len(notice.destinations))
    if len(told) >= MAX_TOLD:
        told.clear()
    told.add(notice.event_id)


def after_load(ctx, fleet: FleetFile, status: FleetStatus | None, use: DayUse, told: set[str]) -> None:
    """A message loaded the fleet's state: a block begun lately (its first telling may have been lost to a crash
    after its write) and the day's budget."""
    now = ctx.now()
    if status is not None and status.blocked_at is not None and now - status.blocked_at <= BLOCKED_RETELL:
        tell(ctx, blocked_notice(fleet, status, now), told)
    tell(ctx, budget_notice(fleet, use, now), told)
