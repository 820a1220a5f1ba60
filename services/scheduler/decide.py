"""The scheduling pass's decision: core (pure, no I/O).

`passreads.py` (the shell) reads a `PassSnapshot` once, `decide_pass` turns it
into every write and message of the pass, and the shell applies them. The
phases are those of Kueue's `schedule()`: read everything, decide in one pure
function, apply. The fleet file enters here once; `plan` matches jobs to idle
TPUs and `capacity` sizes the asks for the jobs left waiting.

The decision assumes its assignments commit. When one is lost to another
writer, that writer changed the same job (usually it assigned the same pair,
which also clears the job's open request), and the shell plans again on fresh
reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from tpuq.contracts.documents import JobDoc, NodeHealth, TpuDoc
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import JobSpec
from tpuq.contracts.jobstate import JobEvent, transition
from tpuq.scheduler import capacity, gangs, lifecycle
from tpuq.scheduler.plan import IdleTpu, PendingJob, eligible_entries, plan

Doc = dict[str, Any]
log = logging.getLogger("tpuq.scheduler")


class Queued(NamedTuple):
    stored: Doc  # the document as read (the lifecycle's input)
    view: JobDoc
    pending: PendingJob


@dataclass(frozen=True)
class Queue:
    """Stored pending jobs, in queue order, each read and parsed once."""

    jobs: dict[str, Queued] = field(default_factory=dict)  # job id -> the stored job, its view, parsed
    unreadable: dict[str, str] = field(default_factory=dict)  # job id -> why its stored spec is skipped


@dataclass(frozen=True)
class PassSnapshot:
    """What one pass reads, before it decides anything."""

    queue: Queue  # the pending jobs
    idle_tpus: list[Doc]  # stored TPUs in state idle
    live_tpus: dict[str, int] = field(default_factory=dict)  # fleet entry id -> TPUs idle, busy or deleting
    open_requests: dict[str, int] = field(default_factory=dict)  # fleet entry id -> jobs with an open request
    held: dict[str, str] = field(default_factory=dict)  # job id -> a new `blocked`: held back by its group's limit


@dataclass(frozen=True)
class PlannedAssignment:
    job_id: str
    tpu_name: str
    writes: lifecycle.AssignmentWrites


@dataclass
class PassDecision:
    assignments: list[PlannedAssignment] = field(default_factory=list)
    # A matched pair that cannot be assigned: the job's fields to write (a rejection), or None (moved on).
    unassignable: list[tuple[str, str, Doc | None]] = field(default_factory=list)  # (job id, tpu name, fields)
    asks: list[capacity.Ask] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # job id -> a new `blocked` reason
    unreadable: dict[str, str] = field(default_factory=dict)  # job id -> why its stored spec is skipped


def pending_job(job: JobDoc) -> PendingJob:
    return PendingJob.from_spec(
        JobSpec.model_validate(job.spec),
        job.submit_time,
        job_id=job.id,
        pinned_region=job.pinned_region,
        not_before=job.not_before,
    )


def tpu_refuses_new_job(doc: Doc, now: datetime) -> str | None:
    """Why an idle TPU takes no new job now, or None: quarantined (its last attempt was preempted or could not
    reach it), or its node is not HEALTHY, or maintenance comes before a job could end
    (`NodeHealth.refuses_new_job`: under way, or its window opens within `MAINTENANCE_HORIZON`)."""
    if doc.get(TpuDoc.field("quarantined")):
        return doc.get(TpuDoc.field("quarantine_reason")) or "quarantined"
    if doc.get(TpuDoc.field("gang_waiting")):
        return "waiting for the other slices of its multislice queued resource to be recorded"
    health = NodeHealth.from_doc(doc)
    return health.refuses_new_job(now) if health is not None else None


def idle_tpu(doc: Doc) -> IdleTpu:
    return IdleTpu(doc["name"], doc["type"], doc["zone"], doc.get("region") or "", doc.get("entry_id"))


def may_ask(queued: Queued) -> bool:
    """A job that names no TPU and holds no open request may ask the claimer for one."""
    return queued.pending.tpu_name is None and not queued.view.capacity_request


def queued(job_id: str, doc: Doc) -> Queued | str:
    """A stored pending job parsed for the queue, or why it cannot be (its stored spec does not validate)."""
    try:
        view = JobDoc.from_doc(doc, job_id)
        return Queued(doc, view, pending_job(view))
    except Exception as e:  # noqa: BLE001 - one bad stored job must not stop the queue
        return f"its stored spec does not validate: {e}"


def queue_of(jobs: list[tuple[str, Doc]]) -> Queue:
    """(job id, stored job) pairs in queue order -> the queue; one bad stored job never stops the others."""
    return queue_from([(job_id, queued(job_id, doc)) for job_id, doc in jobs])


def queue_from(parsed: list[tuple[str, Queued | str]]) -> Queue:
    """(job id, its `queued`) pairs in queue order -> the queue (the shell keeps parses per stored version)."""
    queue = Queue()
    for job_id, entry in parsed:
        if isinstance(entry, str):
            queue.unreadable[job_id] = entry
        else:
            queue.jobs[job_id] = entry
    return queue


def entries_to_count(queue: Queue, fleet: FleetFile | None) -> list[str]:
    """The fleet entries whose room the pass may need: those of every job that may ask for capacity."""
    if fleet is None:
        return []
    return sorted({e.id for q in queue.jobs.values() if may_ask(q) for e in eligible_entries(q.pending, fleet)})


def decide_pass(snapshot: PassSnapshot, fleet: FleetFile | None, runner_bucket: str | None,
                now: datetime) -> PassDecision:
    """Which pending job goes to which idle TPU, and which of the rest ask for capacity or wait blocked."""
    jobs = snapshot.queue.jobs
    decision = PassDecision(unreadable=dict(snapshot.queue.unreadable))
    # A quarantined TPU is never assigned again; an unhealthy or maintenance-bound one not while it is so.
    tpus = {doc.get("name"): doc for doc in snapshot.idle_tpus if tpu_refuses_new_job(doc, now) is None}
    result = plan([q.pending for q in jobs.values()], [idle_tpu(doc) for doc in tpus.values()], fleet, now)

    open_requests = dict(snapshot.open_requests)
    for match in result.matches:
        job = jobs[match.job_id]
        try:
            if match.tpu_names:  # a multislice job's gang: one attempt on every slice (tpuq.scheduler.gangs)
                writes = gangs.gang_assignment(job.stored, [tpus[n] for n in match.tpu_names], match,
                                               job.pending.slices[0], runner_bucket, now)
            else:
                writes = lifecycle.assignment(job.stored, tpus[match.tpu_name], match, runner_bucket, now)
        except ValueError as e:
            # This job can never be assigned (e.g. no bucket and no runner bucket): the table's
            # pending --reject--> rejected edge, and the pass goes on for the others.
            state = transition(job.view.state, JobEvent.reject)
            decision.unassignable.append(
                (match.job_id, match.tpu_name, JobDoc.fields(state=state, reason=f"cannot run: {e}", updated_at=now)))
            continue
        if writes is None:
            decision.unassignable.append((match.job_id, match.tpu_name, None))
            continue
        decision.assignments.append(PlannedAssignment(match.job_id, match.tpu_name, writes))
        served = job.view.capacity_request_entry
        if served in open_requests:  # the assignment closes the job's open request
            open_requests[served] -= 1

    # Every job left waiting shows what holds it (the liveness rule, tpuq.contracts.liveness): an open request, or a reason.
    unmatched = [jobs[j] for j in result.unmatched_job_ids]
    waiting = [q for q in unmatched if may_ask(q)]
    blocked = {q.pending.job_id: capacity.named_tpu_reason(q.pending) for q in unmatched
               if q.pending.tpu_name is not None and not q.view.capacity_request}
    if fleet is None:  # without a fleet there is nothing to claim from
        blocked |= {q.pending.job_id: capacity.NO_FLEET_REASON for q in waiting}
    elif waiting:
        room = capacity.room_per_entry(fleet, snapshot.live_tpus, open_requests)
        decision.asks, asked = capacity.ask_for_capacity(
            [(q.pending, q.view.capacity_requests) for q in waiting], fleet, room, now)
        blocked |= asked
    decision.blocked = {job_id: reason for job_id, reason in blocked.items() if jobs[job_id].view.blocked != reason}
    decision.blocked |= snapshot.held  # (tpuq.scheduler.grouplimit: only the reasons not already stored)
    return decision
