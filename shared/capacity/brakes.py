"""Core (pure, no I/O): the brakes on claiming. Paused, over the day's VM-hour budget, past the grant's end.

The claimer's decision core asks `claim_stop_reason` before it plans any create; `tpuq fleet` and the waiting
jobs show the same sentences. Time is passed in.

- VM-hours: one TPU VM host for one hour. A slice of H hosts alive for T hours uses H x T (a v4-32 has 4 hosts).
  That is what a TRC user pays in: the chips are granted, the VMs' hours are what runs out. A slice counts from
  the moment the scheduler recorded it ACTIVE (`tpus/{node}.created_at`) until it was recorded gone (`gone_at`).
- The day is the UTC day: use restarts at 00:00 UTC.
- Budget: a create is refused when the day's use so far, plus one more hour of every slice alive and of the new
  one, would pass `budget.vm_hours_per_day`. Slices alive are never stopped by the budget (their jobs finish);
  idle ones go by the idle rule as always.
- Grant: `grant_expires` is the grant's last day (UTC). Nothing is claimed from the next day on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from typing import Any

from tpuq.contracts.documents import TpuDoc, TpuState
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.tputypes import UnknownAcceleratorType, parse_accelerator_type

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class DayUse:
    """The fleet's VM-hours since 00:00 UTC, and the hosts of the slices alive now."""

    vm_hours: float = 0.0
    alive_hosts: int = 0


def day_start(now: datetime) -> datetime:
    return datetime.combine(now.astimezone(timezone.utc).date(), time(0), tzinfo=timezone.utc)


def hosts_of(tpu_type: str | None) -> int:
    """The VMs (hosts) of one slice of this type."""
    try:
        return parse_accelerator_type(tpu_type or "").hosts
    except UnknownAcceleratorType:
        return 1  # a type this tpuq does not know still runs at least one VM


def day_use(tpus: Iterable[Mapping[str, Any]], fleet_name: str, now: datetime) -> DayUse:
    """From the scheduler's tpus/{node} documents (any state, gone ones included)."""
    start = day_start(now)
    used = timedelta()
    alive = 0
    for t in tpus:
        if t.get("fleet") not in (None, fleet_name) or not isinstance(t.get("created_at"), datetime):
            continue
        hosts = hosts_of(t.get("type"))
        gone = t.get("state") == TpuState.gone
        end = (t.get(TpuDoc.field("gone_at")) or t.get("updated_at")) if gone else now
        if not isinstance(end, datetime):
            continue
        if not gone:
            alive += hosts
        begin = max(t["created_at"], start)
        if end > begin:
            used += (min(end, now) - begin) * hosts
    return DayUse(vm_hours=used / HOUR, alive_hosts=alive)


def grant_days_left(fleet: FleetFile, now: datetime) -> int | None:
    """Days of the grant left, today included (1 on its last day, 0 or less once it ended); None: no date."""
    if fleet.grant_expires is None:
        return None
    return (fleet.grant_expires - now.astimezone(timezone.utc).date()).days + 1


def grant_ended(fleet: FleetFile, now: datetime) -> bool:
    left = grant_days_left(fleet, now)
    return left is not None and left <= 0


def budget_allows(fleet: FleetFile, use: DayUse, new_hosts: int) -> bool:
    if fleet.budget is None:
        return True
    return use.vm_hours + (use.alive_hosts + new_hosts) <= fleet.budget.vm_hours_per_day


def claim_stop_reason(fleet: FleetFile, paused: bool, use: DayUse, now: datetime, new_hosts: int) -> str | None:
    """Why no new queued resource may be created now (a sentence for people), or None: claiming may go on.

    `new_hosts`: the hosts of the slice about to be asked for."""
    if paused:
        return f"fleet {fleet.name} is paused (tpuq fleet resume)"
    if grant_ended(fleet, now):
        assert fleet.grant_expires is not None
        return f"the grant ended on {fleet.grant_expires.isoformat()} (grant_expires)"
    if not budget_allows(fleet, use, new_hosts):
        assert fleet.budget is not None
        return (f"over budget for today: {use.vm_hours:.1f} VM-hours used, {use.alive_hosts} host(s) alive, "
                f"+{new_hosts} would pass {fleet.budget.vm_hours_per_day:g} VM-hours/day (resumes 00:00 UTC)")
    return None
