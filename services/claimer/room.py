"""Core (pure): how much room a fleet entry, a zone's quota and the brakes leave for new slices.

The claimer's one notion of each, counted in slices: a multislice queued resource of N slices holds N slices of
its entry's `count`, N times its type's chips of quota and N times its hosts against the VM-hour budget (issue 37:
"the fleet's count, brakes and budgets count slices").
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from tpuq.capacity.brakes import claim_stop_reason, hosts_of
from tpuq.capacity.quota import EffectiveQuota, quota_pool
from tpuq.claimer.model import ClaimState
from tpuq.contracts.documents import QrRecord
from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.racing import HELD_STATES
from tpuq.contracts.tputypes import zone_region


def claim_gate(state: ClaimState, request_id: str, types: tuple[str, ...], qrs: Iterable[QrRecord],
               now: datetime, slices: int = 1) -> str | None:
    """The brakes, as one gate before creates: why request `request_id` may not create now, or None.

    Paused, past `grant_expires`, or over `budget.vm_hours_per_day`. Against the budget the request counts as
    `slices` slices (a gang: its smallest size) of the smallest of its types, and so does every other request still
    racing (its smallest racer: one of them may win), on top of the slices alive."""
    racing: dict[str, set[int]] = {}
    for q in qrs:
        if q.pending and q.request_id != request_id:
            racing.setdefault(q.request_id, set()).add(hosts_of(q.type) * q.slices)
    new_hosts = min((hosts_of(t) for t in types), default=1) * slices + sum(min(h) for h in racing.values())
    return claim_stop_reason(state.fleet, state.paused, state.day_use, now, new_hosts)


def slices_held(qrs: Iterable[QrRecord], entry: FleetEntry) -> int:
    """Slices the entry holds (PROVISIONING or ACTIVE): what `count` caps, a multislice request's every slice.
    Racers still queued hold none."""
    return sum(q.slices for q in qrs if q.entry_id == entry.id and q.state in HELD_STATES)


def quota_allows(quota: EffectiveQuota, fleet: FleetFile, qrs: Iterable[QrRecord], zone: str, entry: FleetEntry,
                 slices: int = 1) -> bool:
    """Whether `zone` has quota left for `slices` more slices of `entry`: the claimer's one notion of "this zone
    has quota", from the effective quota (declared in the fleet file, else the Cloud Quotas API's; None: not
    checked or unlimited, so yes). A per-region quota is shared: every live slice of the pool in the region
    counts against it, each of a multislice request's slices."""
    accel = entry.accelerator
    limit = quota.of(zone, accel, entry.provisioning_model)
    if limit is None:
        return True
    pool, region = quota_pool(accel), zone_region(zone)
    used_in_zone = used_in_region = 0
    for q in qrs:  # every live queued resource holds quota, FAILED and SUSPENDED included
        other = fleet.entry(q.entry_id)
        if other is None or quota_pool(other.accelerator) != pool \
                or other.provisioning_model is not entry.provisioning_model:
            continue
        if zone_region(q.zone) == region:
            used_in_region += other.accelerator.chips * q.slices
            if q.zone == zone:
                used_in_zone += other.accelerator.chips * q.slices
    wanted = accel.chips * slices
    if limit.chips is not None and limit.chips - used_in_zone < wanted:
        return False
    shared = limit.region.chips if limit.region is not None else None
    return shared is None or shared - used_in_region >= wanted
