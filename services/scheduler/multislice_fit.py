"""Core (pure): can any fleet entry ever hold a multislice job's gang of slices? (issue 37)

The matcher places a gang of N slices of one type in one zone; the claimer will claim one multislice queued resource
of N slices from one entry in one zone. So the fleet can serve `slices: N` only if some entry of the job's type has a
zone it may use where all of these hold:
- the entry may hold N slices at once: `max_slices` (its `count`, capped by `chip_limit`) is at least N;
- the zone's declared quota (the fleet file's `quota:`, chips of the family and tier) is at least N x chips of one
  slice; a zone with no declared quota is not judged here (the claimer reads the Cloud Quotas API);
or that zone has N `existing` nodes of the type (the matcher may gang idle existing nodes; nothing is claimed).
An elastic job (`slices: [4, 2]`) needs this for its smallest count; `tpuq validate` says when only a smaller count
than its largest fits. Every reason names the entry and why, e.g. "entry v4 holds at most 1 slice (count 1)".
"""

from __future__ import annotations

from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.tputypes import zone_region
from tpuq.scheduler.plan import PendingJob, eligible_entries


def usable_zones(job: PendingJob, entry: FleetEntry) -> list[str]:
    return [z for z in entry.zones if (job.zone is None or job.zone == z) and job.region_allowed(zone_region(z))]


def entry_refusal(job: PendingJob, entry: FleetEntry, fleet: FleetFile, n: int) -> str | None:
    """Why `entry` can never hold `n` slices of `job` at once, or None if it can."""
    if entry.existing:
        return f"entry {entry.id} is one existing node ({entry.existing})"
    if entry.max_slices < n:
        capped = f", chip_limit {entry.chip_limit}" if entry.max_slices < entry.count else ""
        return f"entry {entry.id} holds at most {entry.max_slices} slice(s) (count {entry.count}{capped}), below {n}"
    accel = entry.accelerator
    need = n * accel.chips
    short = []
    for zone in usable_zones(job, entry):
        declared = fleet.declared_quota_chips(zone, accel.family, entry.provisioning_model)
        if declared is None or declared >= need:
            return None
        short.append(f"{zone} {declared}")
    return (f"entry {entry.id}'s declared {entry.provisioning_model.value} quota ({', '.join(short)} chips) is below "
            f"{n} x {accel.chips} = {need} chips of {accel.name} in every zone")


def existing_gang_zone(job: PendingJob, entries: list[FleetEntry], n: int) -> str | None:
    """A zone with at least `n` existing nodes the job may use, if any."""
    per_zone: dict[str, int] = {}
    for entry in entries:
        if entry.existing:
            for zone in usable_zones(job, entry):
                per_zone[zone] = per_zone.get(zone, 0) + 1
    return next((z for z, k in sorted(per_zone.items()) if k >= n), None)


def largest_holdable(job: PendingJob, fleet: FleetFile) -> tuple[int | None, list[str]]:
    """The largest of the job's counts some entry (or zone of existing nodes) can hold, and, when none can, why
    not for its smallest count: one reason per entry."""
    entries = eligible_entries(job, fleet)
    reasons: list[str] = []
    for n in job.slices:
        reasons = [r for e in entries if (r := entry_refusal(job, e, fleet, n)) is not None]
        if len(reasons) < len(entries) or existing_gang_zone(job, entries, n):
            return n, []
    return None, reasons


def unholdable_reason(job: PendingJob, fleet: FleetFile | None) -> str | None:
    """Why no entry of `fleet` can ever hold `job`'s gang (its smallest count), naming each entry and why; None for
    a single-slice job, without a fleet, or when no entry offers the type at all (`capacity.unrunnable_reason`)."""
    if fleet is None or not job.multislice or not eligible_entries(job, fleet):
        return None
    n, reasons = largest_holdable(job, fleet)
    if n is not None:
        return None
    wanted = " or ".join(str(k) for k in job.slices)
    return f"no fleet entry can hold {wanted} {job.types[0]} slices at once in one zone: {'; '.join(reasons)}"


def fit_notes(job: PendingJob, fleet: FleetFile | None) -> list[str]:
    """What `tpuq validate` says of a multislice job against a fleet: why nothing holds it, or that an elastic job
    gets at most a smaller count than its largest."""
    if fleet is None or not job.multislice or not eligible_entries(job, fleet):
        return []
    reason = unholdable_reason(job, fleet)
    if reason:
        return [reason]
    n, _ = largest_holdable(job, fleet)
    if n is not None and n < job.slices[0]:
        # Why the larger counts are never had, for the smallest of them: each entry's limit (count or quota).
        larger = min(c for c in job.slices if c > n)
        why = "; ".join(r for e in eligible_entries(job, fleet) if (r := entry_refusal(job, e, fleet, larger)))
        return [f"slices {list(job.slices)}: {n} is the largest of these counts fleet {fleet.name} can hold at once "
                f"in one zone ({larger}: {why}), so the larger counts are never had"]
    return []


def validate_lines(fleet: FleetFile | None, jobs, now) -> list[str]:
    """`tpuq validate`'s lines for the multislice jobs of a job file (`JobFile`), with a fleet or without: whether
    the fleet can hold each."""
    lines = []
    for i, spec in enumerate(jobs.jobs):
        if spec.slice_counts[0] <= 1:
            continue
        name = spec.name or spec.id or f"jobs[{i}]"
        job = PendingJob.from_spec(spec, now, job_id=spec.id or f"jobs-{i}")
        lines += [f"job {name}: {note}" for note in fit_notes(job, fleet)]
    return lines
