"""Core (pure, no I/O): which waiting jobs ask the claimer for a slice, within the fleet's limits.

One request per waiting job attempt. Its id is derived from the job id and a
per-job counter, so a redelivery, a crash between publishing and recording, or
a second scheduler instance produce the same id again and the claimer sees one
request. Each request is charged to one fleet entry (the eligible entry with
the most room) so that the slices requested plus the TPUs that exist never
exceed an entry's `max_slices` (count, capped by chip_limit). The claimer is
still free to serve the request from any eligible entry; the charge only keeps
the scheduler from asking for more than the fleet may hold.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.messages import CapacityAction, CapacityRequest
from tpuq.scheduler.plan import PendingJob, eligible_entries
from tpuq.scheduler.multislice_fit import unholdable_reason

_REQUEST_ID_MAX = 41
_REQUEST_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


def request_id_for(job_id: str, n: int) -> str:
    """`r-{job_id}-{n}`; a job id too long for the claimer's limit is shortened with a hash."""
    plain = f"r-{job_id}-{n}"
    if len(plain) <= _REQUEST_ID_MAX and _REQUEST_ID_RE.match(plain):
        return plain
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:10]
    suffix = f"-{digest}-{n}"
    head = job_id[: _REQUEST_ID_MAX - len("r-") - len(suffix)].rstrip("-")
    return f"r-{head}{suffix}"


@dataclass(frozen=True)
class Ask:
    """A capacity request to publish for one job, and what to record on the job."""

    job_id: str
    n: int
    entry_id: str
    message: CapacityRequest

    @property
    def record(self) -> dict:
        record = {"id": self.message.request_id, "n": self.n, "entry_id": self.entry_id, "at": self.message.at}
        if self.message.slices:
            # A gang's request holds room for its largest size: `open_requests_of` adds slices - 1 for it.
            record |= {"gang_entry_id": self.entry_id, "slices": self.message.slices[0]}
        return record


def withdrawal(request_id: str, fleet: str, now: datetime) -> CapacityRequest:
    return CapacityRequest(request_id=request_id, action=CapacityAction.withdraw, fleet=fleet, count=0, at=now)


def no_entry_reason(job: PendingJob) -> str:
    where = f" in zone {job.zone}" if job.zone else ""
    regions = {job.pinned_region} if job.pinned_region else job.regions
    where += f" in regions {', '.join(sorted(regions))}" if regions and not job.zone else ""
    return f"no fleet entry offers {'a TPU' if job.any_type else ' or '.join(job.types)}{where}"


def fleet_offers(fleet: FleetFile) -> str:
    """What a fleet's entries offer, for people: "fleet demo offers v4-8 in us-central2-a, us-central2-b; v4-32 in
    us-central2-a"."""
    offers: dict[str, list[str]] = {}
    for entry in fleet.tpus:
        zones = offers.setdefault(entry.type, [])
        zones += [z for z in entry.zones if z not in zones]
    listed = "; ".join(f"{t} in {', '.join(zones)}" for t, zones in offers.items())
    return f"fleet {fleet.name} offers {listed or 'nothing'}"


def unrunnable_reason(job: PendingJob, fleet: FleetFile | None) -> str | None:
    """Why no entry of `fleet` could ever run `job` (its types, zone and regions), naming what the fleet offers;
    None when one could (or no fleet is stored: nothing is known). `tpuq submit` refuses such a job; the
    scheduler's intake stores it pending and blocked with this reason (a later `fleet apply` may lift it)."""
    if fleet is None:
        return None
    if eligible_entries(job, fleet):
        return unholdable_reason(job, fleet)  # a multislice job: some entry must hold its gang (None otherwise)
    return f"{no_entry_reason(job)}; {fleet_offers(fleet)}"


NO_FLEET_REASON = "no fleet file is stored, so no TPU is claimed: run `tpuq fleet apply FLEET.yaml`"


def named_tpu_reason(job: PendingJob) -> str:
    """A job that names its node (`tpu_name`) asks for no capacity: it waits for that node alone."""
    return f"waiting for TPU {job.tpu_name} (its tpu_name) to be idle and healthy"


def existing_reason(entries: list[FleetEntry]) -> str:
    nodes = ", ".join(f"{e.existing} in {e.zones[0]}" for e in entries)
    return f"waiting for an existing TPU to be idle and healthy (tpuq creates none for it): {nodes}"


def full_reason(entries: list[FleetEntry]) -> str:
    limits = ", ".join(f"{e.id} ({e.type}) max {e.max_slices}" for e in entries)
    return f"waiting for a TPU: the fleet holds or has requested its maximum of every fitting entry: {limits}"


def slices_to_ask(job: PendingJob, room: int) -> tuple[int, ...]:
    """The gang sizes one request for `job` may ask of an entry with `room` slices left, largest first: its counts
    that fit (an elastic job settles for less); () when none does. An entry's `count` counts slices, not requests."""
    return tuple(n for n in job.slices if n <= room)


def ask_for_capacity(
    waiting: list[tuple[PendingJob, int]],
    fleet: FleetFile,
    room: dict[str, int],
    now: datetime,
) -> tuple[list[Ask], dict[str, str]]:
    """Requests for `waiting` (job, requests made so far), in scheduling order; and blocked reasons.

    `room` maps entry id -> max_slices minus existing TPUs minus outstanding
    requests; it is consumed as requests are charged. Jobs that no entry can
    serve, or whose entries are full, get a reason instead of a request.
    """
    asks: list[Ask] = []
    blocked: dict[str, str] = {}
    for job, made in waiting:
        # An `existing` entry is one node a person made: the claimer never creates for it.
        eligible = eligible_entries(job, fleet)
        entries = [e for e in eligible if not e.existing]
        if not entries:
            # Only existing nodes fit: it waits for one of them to be idle (`tpuq status` says which ails).
            blocked[job.job_id] = (existing_reason(eligible) if eligible
                                   else unrunnable_reason(job, fleet) or no_entry_reason(job))
            continue
        best = max(entries, key=lambda e: room.get(e.id, 0))  # max() keeps the first of equals: fleet order
        sizes = slices_to_ask(job, room.get(best.id, 0))
        if not sizes:
            # A gang no entry could ever hold says so (the intake's reason), not that the fleet is full.
            blocked[job.job_id] = unholdable_reason(job, fleet) or full_reason(entries)
            continue
        # A multislice job asks for one queued resource of N slices (an elastic job: the sizes that fit, largest
        # first), charged as its largest; a single-slice job for one slice.
        room[best.id] -= sizes[0]
        n = made + 1
        regions = [job.pinned_region] if job.pinned_region else sorted(job.regions)
        asks.append(
            Ask(
                job.job_id,
                n,
                best.id,
                CapacityRequest(
                    request_id=request_id_for(job.job_id, n),
                    fleet=fleet.name,
                    types=list(dict.fromkeys(e.type for e in entries)) if job.any_type else list(job.types),
                    regions=regions,
                    zones=[job.zone] if job.zone else [],
                    count=1,
                    slices=list(sizes) if sizes[0] > 1 else [],
                    job_ids=[job.job_id],
                    at=now,
                ),
            )
        )
    return asks, blocked


def room_per_entry(fleet: FleetFile, live_tpus: dict[str, int], outstanding: dict[str, int]) -> dict[str, int]:
    """max_slices minus the TPUs that exist (keep-warm ones included: they are supply) minus open requests."""
    return {e.id: e.max_slices - live_tpus.get(e.id, 0) - outstanding.get(e.id, 0) for e in fleet.tpus}
