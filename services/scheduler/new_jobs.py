"""The scheduler's intake of new jobs, shared by the jobs topic's handler (tpuq.scheduler.handlers) and the
bucket upload's (tpuq.scheduler.gcs_submit): read the fleet in force, store each job as pending, run a pass."""

from __future__ import annotations

import logging
import threading

from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import fleet_or_none
from tpuq.contracts.jobspec import PublishedJob
from tpuq.contracts.messages import message_owner
from tpuq.scheduler import arrays, capacity, dependencies, intake
from tpuq.scheduler.grouping import CoveringPasses, GroupedPasses
from tpuq.scheduler.plan import PendingJob
from tpuq.scheduler.scheduling import scheduling_pass
from tpuq.runtime.service import Context

log = logging.getLogger("tpuq.scheduler")


def fleet_in_force(ctx: Context) -> FleetFile | None:
    """The stored fleet; None before any is stored: jobs are still queued and matched, nothing is claimed."""
    return fleet_or_none(ctx.clients.firestore, ctx.settings.fleet)


def submit_jobs(ctx: Context, jobs: list[PublishedJob], source: str, fleet: FleetFile | None = None,
                from_file: bool = False) -> list[str]:
    """Store each job as pending (blocked from the first second if no entry can run it), keyed by this
    message's id, then run a pass; returns the job ids. The jobs topic's intake, and the bucket upload's.
    `from_file`: the jobs of one `jobs:` file, all stored or (an id taken by another submission) none."""
    if from_file:
        intake.refuse_taken_ids(ctx.clients.firestore, jobs, ctx.message_id)
    # A name in `depends_on` is a stored job or group, or one of this message's jobs (else refused, naming the field).
    dependencies.unknown_names(ctx.clients.firestore, jobs, {j.id for j in jobs if j.id},
                               prefix="jobs" if from_file else None)
    owner = message_owner(ctx.attributes)
    job_ids = []
    for n, job in enumerate(jobs):
        blocked = capacity.unrunnable_reason(
            PendingJob.from_spec(job, ctx.now(), job_id=intake.job_id_for(job, ctx.message_id)), fleet)
        if job.is_group:  # its tasks, stored all or nothing (tpuq.scheduler.arrays)
            ids, stored = arrays.store_group(
                ctx.clients.firestore, job, ctx.message_id, field=f"jobs[{n}].id" if from_file else "id",
                document=lambda task, task_id: intake.job_document(task, task_id, source, ctx.message_id, ctx.now(),
                                                                   blocked, owner))
            log.info("group %s: %d tasks, %d stored now (source %s)%s", arrays.group_id_for(job, ctx.message_id),
                     len(ids), stored, source, f", blocked: {blocked}" if blocked and stored else "")
            job_ids += ids
            continue
        job_id, created = intake.store_job(ctx.clients.firestore, job, source, ctx.message_id, ctx.now(), blocked, owner)
        log.info("job %s %s (source %s)%s", job_id, "stored as pending" if created else "already stored", source,
                 f", blocked: {blocked}" if blocked and created else "")
        job_ids.append(job_id)
    # Also on a redelivery: the pass after the first delivery may not have run. Grouped with the other pushes'
    # jobs stored meanwhile (tpuq.scheduler.grouping): one pass for a burst, not one per job.
    new_job_passes(ctx).plan(job_ids, lambda batch: scheduling_pass(ctx, fleet, trigger_job_ids=batch))
    return job_ids


_GROUPS: dict[int, GroupedPasses] = {}
_COVERING: dict[int, CoveringPasses] = {}
_GROUPS_LOCK = threading.Lock()


def new_job_passes(ctx: Context) -> GroupedPasses:
    """This instance's grouping of new-job passes (one per set of clients: one per process in a service)."""
    with _GROUPS_LOCK:
        return _GROUPS.setdefault(id(ctx.clients), GroupedPasses())


def whole_queue_pass(ctx: Context, fleet: FleetFile | None, job_ids: list[str] | tuple = ()) -> None:
    """A pass over the whole queue (a TPU freed or new, a job requeued), with `job_ids` planned in it all the
    same; one at a time per instance, each covering every request made before it began
    (tpuq.scheduler.grouping.CoveringPasses)."""
    with _GROUPS_LOCK:
        passes = _COVERING.setdefault(id(ctx.clients), CoveringPasses())
    passes.run(job_ids, lambda batch: scheduling_pass(ctx, fleet, trigger_job_ids=batch, full=True))
