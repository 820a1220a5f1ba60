"""Core (pure, no I/O): what a job, its attempt and a TPU become after an event.

Every function takes plain documents (dicts as Firestore returns them, or None
when absent), the event, and the clock / randomness, and returns the fields to
write (None: write nothing). A job or attempt is read through its view
(`tpuq.contracts.documents.JobDoc`) and its writes are built with `JobDoc.fields` /
`AttemptDoc.fields`, which write exactly the fields named. The handlers read the documents, call these and
commit the result with `tpuq.runtime.guarded.commit_if_unchanged`; nothing here touches
a client. An event that the job's state does not allow (a redelivery, a stale
attempt) yields no writes: `jobstate.transition` is the only judge.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from tpuq.contracts import gcslayout
from tpuq.contracts.documents import (AttemptDoc, AttemptState, ExecutionDoc, ExecutionEnd, ExecutionState, JobDoc, TpuDoc,
                                      TpuState, short_node_name)
from tpuq.contracts.documents.jobs import ASKING_AGAIN, RACING_ON
from tpuq.contracts.documents.tpus import lost_by_preemption, lost_node_detail
from tpuq.contracts.fleet import FleetFile, RetryBudgets
from tpuq.contracts.jobspec import JobSpec, PublishedJob
from tpuq.contracts.jobstate import still_unstarted, IllegalTransition, JobEvent, JobState, RetryDecision, retry_decision, transition
from tpuq.contracts.messages import Assignment, AssignmentAction, AttemptOutcome, FailureClass, FleetEvent, FleetEventKind, WorkerEndpoint
from tpuq.scheduler.plan import Match
from tpuq.contracts.tputypes import canonical_name, zone_region

Doc = dict[str, Any]

def attempt_id_for(job_id: str, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def job_bucket_for(spec: JobSpec, region: str, runner_bucket: str | None) -> str:
    """The job's bucket in `region`, or the runner bucket when the job lists none."""
    bucket = spec.bucket_for_region(region)
    if bucket:
        return bucket
    if spec.buckets:  # plan() only offers regions of the job's buckets; reaching here is a bug upstream
        raise ValueError(f"job has no bucket in region {region}")
    if not runner_bucket:
        raise ValueError("the job lists no bucket and no runner bucket is configured (TPUQ_RUNNER_BUCKET)")
    return runner_bucket if runner_bucket.startswith("gs://") else f"gs://{runner_bucket}"


def attempt_gcs_dir(job_bucket: str, job_id: str, attempt: int) -> str:
    return f"{job_bucket}/{gcslayout.attempt_prefix(job_id, attempt)}"


def checkpoint_gcs_dir(job_bucket: str, job_id: str) -> str:
    return f"{job_bucket}/{gcslayout.checkpoint_prefix(job_id)}"


# --------------------------------------------------------------------- TPUs


def entry_for(fleet: FleetFile | None, event: FleetEvent) -> str | None:
    """The fleet entry a node belongs to: the claimer says so, else the first entry of its type and zone."""
    if event.entry_id or fleet is None:
        return event.entry_id
    node_type = canonical_name(event.type)
    entry = next((e for e in fleet.tpus if e.type == node_type and event.zone in e.zones), None)
    return entry.id if entry else None


def _node_identity(event: FleetEvent, entry_id: str | None) -> Doc:
    assert event.node
    return {
        "name": event.node,
        "short": short_node_name(event.node),
        "fleet": event.fleet,
        "zone": event.zone,
        "region": zone_region(event.zone),
        "type": canonical_name(event.type),
        "entry_id": entry_id,
        "request_id": event.request_id,
        "queued_resource": event.queued_resource,
        **({"slice_index": event.slice_index, "slice_count": event.slice_count} if event.slice_index is not None
           else {}),
    }


def _reading_is_newer(existing: Doc, event: FleetEvent) -> bool:
    """Whether the event's health reading is newer than the stored one. Pub/Sub may deliver a node's ACTIVE event
    again long after a later NODE_HEALTH (a redelivery after a failed push); its older reading must not replace it."""
    stored = existing.get(TpuDoc.field("node_health_at"))
    return stored is None or event.at >= stored


def tpu_on_active(existing: Doc | None, event: FleetEvent, fleet: FleetFile | None, now: datetime) -> Doc | None:
    """An ACTIVE node: a new idle TPU, or fresher endpoints for a known one (never resets a busy TPU)."""
    if not event.node:
        return None
    if existing is not None and existing.get("state") == TpuState.gone:
        return None  # gone is final: an ACTIVE that arrives late (or is redelivered) must not revive it
    health = event.node_health.to_doc() if event.node_health else None
    details = {
        **_node_identity(event, entry_for(fleet, event)),
        "endpoints": [e.model_dump(mode="json", exclude_none=True) for e in event.endpoints],
        "chips": event.chips,
        "hosts": event.hosts,
        "spot": event.spot,
    }
    if existing is None:
        return {
            **details,
            **TpuDoc.fields(node_health=health, node_health_at=event.at if health else None, state=TpuState.idle,
                            job_id=None, attempt_id=None, idle_since=now, created_at=now, updated_at=now),
            **(TpuDoc.fields(gang_waiting=True) if event.slice_count > 1 else {}),
        }
    changed = {k: v for k, v in details.items() if existing.get(k) != v and v is not None}
    if health is not None and existing.get(TpuDoc.field("node_health")) != health and _reading_is_newer(existing, event):
        changed.update(TpuDoc.fields(node_health=health, node_health_at=event.at))
    return {**changed, "updated_at": now} if changed else None


def tpu_on_health(existing: Doc | None, event: FleetEvent, now: datetime) -> Doc | None:
    """NODE_HEALTH: the node's health, symptoms and upcoming maintenance as the claimer now reads them. Only the
    record changes here: the pass skips a TPU whose health refuses new jobs (`decide.tpu_refuses_new_job`), and the
    executor ends an attempt on an unhealthy node as an infrastructure failure, like a host it lost."""
    if existing is None or existing.get("state") == TpuState.gone or event.node_health is None:
        return None
    health = event.node_health.to_doc()
    if existing.get(TpuDoc.field("node_health")) == health or not _reading_is_newer(existing, event):
        return None
    return TpuDoc.fields(node_health=health, node_health_at=event.at, updated_at=now)


def tpu_on_gone(existing: Doc | None, event: FleetEvent, now: datetime) -> Doc | None:
    """SUSPENDED / GONE / FAILED for a node: the TPU is gone (recorded even if never seen ACTIVE)."""
    if existing is not None and existing.get("state") == TpuState.gone:
        return None
    fields: Doc = TpuDoc.fields(state=TpuState.gone, gone_at=now, gone_reason=event.kind.value, updated_at=now)
    if existing is None:
        fields |= {
            **_node_identity(event, event.entry_id),
            "job_id": None,
            "attempt_id": None,
            "created_at": now,
        }
    return fields


def tpu_freed(tpu: Doc | None, attempt_id: str, now: datetime, suspect: str | None = None) -> Doc | None:
    """A TPU busy with this attempt becomes idle; any other TPU state is left alone.

    `suspect`: why the attempt could not finish on it (preempted, unreachable). Such a TPU is quarantined:
    never assigned again (it would fail the next job too, and burn that job's budget), and deleted by the
    janitor at once instead of after the idle timeout.
    """
    if tpu is None or tpu.get("state") != TpuState.busy or tpu.get("attempt_id") != attempt_id:
        return None
    freed = TpuDoc.fields(state=TpuState.idle, job_id=None, attempt_id=None, idle_since=now, updated_at=now)
    if suspect:
        freed.update(TpuDoc.fields(quarantined=True, quarantine_reason=suspect[:500]))
    return freed


# -------------------------------------------------------------- assignment


@dataclass(frozen=True)
class AssignmentWrites:
    job: Doc
    tpu: Doc
    attempt: Doc
    message: Assignment
    withdraw_request_id: str | None  # the job's capacity request, now unneeded
    gang_tpus: tuple[str, ...] = ()  # a multislice attempt's other slices' TPUs, given the same fields as `tpu`


def assignment(stored: Doc, tpu: Doc, match: Match, runner_bucket: str | None,
               now: datetime) -> AssignmentWrites | None:
    """Pending job + idle TPU -> assigned attempt n+1 on a busy TPU; None when either has moved on."""
    if tpu.get("state") != TpuState.idle:
        return None
    job = JobDoc.from_doc(stored)
    try:
        assigned = transition(job.state, JobEvent.assign)
    except IllegalTransition:
        return None
    job_id = job.id
    spec = PublishedJob.model_validate(job.spec)
    n = job.attempt + 1
    attempt_id = attempt_id_for(job_id, n)
    bucket = job_bucket_for(spec, match.region, runner_bucket)
    checkpoints = job.checkpoint_gcs_dir if job.pinned_region == match.region else None
    checkpoints = checkpoints or checkpoint_gcs_dir(bucket, job_id)
    attempt_dir = attempt_gcs_dir(bucket, job_id, n)
    node = tpu["name"]
    served = job.capacity_request_id
    return AssignmentWrites(
        job=JobDoc.fields(
            state=assigned,
            attempt=n,
            attempts=n,
            attempt_id=attempt_id,
            tpu=node,
            zone=match.zone,
            region=match.region,
            job_bucket=bucket,
            attempt_gcs_dir=attempt_dir,
            checkpoint_gcs_dir=checkpoints,
            assigned_at=now,
            assignment_republished_at=None,  # the tick's count of sends is per attempt
            assignment_republishes=0,
            not_before=None,
            capacity_request=None,
            blocked=None,
            cancel_requested=False,
            updated_at=now,
        ),
        tpu=TpuDoc.fields(state=TpuState.busy, job_id=job_id, attempt_id=attempt_id, busy_since=now, updated_at=now),
        attempt=AttemptDoc.fields(
            attempt=n,
            attempt_id=attempt_id,
            tpu=node,
            zone=match.zone,
            region=match.region,
            state=AttemptState.assigned,
            outcome=None,
            detail=None,
            assigned_at=now,
            started_at=None,
            ended_at=None,
        ),
        message=Assignment(
            job_id=job_id,
            attempt=n,
            attempt_id=attempt_id,
            node=node,
            zone=match.zone,
            endpoints=[WorkerEndpoint.model_validate(e) for e in tpu.get("endpoints") or []],
            job=spec,
            job_bucket=bucket,
            attempt_gcs_dir=attempt_dir,
            checkpoint_gcs_dir=checkpoints,
            preemptions=job.preemptions,
            resuming=earlier_attempt_started(job),
            array_index=job.array_index,
            array_size=job.array_size,
            at=now,
        ),
        withdraw_request_id=served if served and served != tpu.get("request_id") else None,
    )


def assignment_message(stored: Doc, tpu_endpoints: list[Doc], now: datetime,
                       action=AssignmentAction.assign) -> Assignment:
    """The Assignment for the job's current attempt, rebuilt from its document (cancel, republish)."""
    job = JobDoc.from_doc(stored)
    run = action is AssignmentAction.assign
    return Assignment(
        action=action,
        job_id=job.id,
        attempt=job.attempt,
        attempt_id=job.attempt_id,
        node=job.tpu,
        zone=job.zone,
        endpoints=[WorkerEndpoint.model_validate(e) for e in tpu_endpoints] if run else [],
        job=PublishedJob.model_validate(job.spec) if run else None,
        job_bucket=job.job_bucket if run else None,
        attempt_gcs_dir=job.attempt_gcs_dir if run else None,
        checkpoint_gcs_dir=job.checkpoint_gcs_dir if run else None,
        preemptions=job.preemptions if run else 0,
        resuming=earlier_attempt_started(job) if run else False,
        array_index=job.array_index if run else None,
        array_size=job.array_size if run else None,
        at=now,
    )


def earlier_attempt_started(job: JobDoc) -> bool:
    """Whether an attempt before the one being assigned (a pending job) or sent again (an assigned one) started, for
    TPUQ_RESUMING: every start writes the job's `started_at` and nothing clears it, so a pending job with one had an
    attempt start, and an assigned job had one start before its current assignment (`assigned_at`)."""
    if job.started_at is None:
        return False
    return job.assigned_at is None or job.state is JobState.pending or job.started_at < job.assigned_at


# ---------------------------------------------------------------- attempts


def _current(stored: Doc | None, attempt: int) -> JobDoc | None:
    """The job's view if `attempt` is its current attempt; None for a missing job or a stale attempt."""
    if stored is None:
        return None
    job = JobDoc.from_doc(stored)
    return job if job.attempt == attempt else None


def attempt_started(stored: Doc | None, attempt: int, started_at: datetime, now: datetime
                    ) -> tuple[Doc | None, Doc | None]:
    """(job fields, attempt fields) for `started`: assigned -> running, pinning the region. `started_at` is the
    executor's time of the start (the event's), `now` the handling's. Pub/Sub does not order: a short attempt's end
    can be handled before its start, and the start then changes no state but still says when the attempt began."""
    job = _current(stored, attempt)
    if job is None:
        return None, None
    try:
        state = transition(job.state, JobEvent.start)
    except IllegalTransition:
        unrecorded = job.started_at is None or (job.assigned_at is not None and job.started_at < job.assigned_at)
        return (JobDoc.fields(started_at=started_at) if unrecorded else None,
                AttemptDoc.fields(started_at=started_at))
    return (
        JobDoc.fields(state=state, started_at=started_at, pinned_region=job.region, updated_at=now),
        AttemptDoc.fields(state=AttemptState.running, started_at=started_at),
    )


@dataclass(frozen=True)
class AttemptEnd:
    job: Doc | None  # None: stale or repeated event, the job is left alone
    attempt: Doc | None
    decision: RetryDecision | None


def attempt_ended(
    stored: Doc | None,
    attempt: int,
    outcome: AttemptOutcome,
    detail: str | None,
    budgets: RetryBudgets,
    now: datetime,
    rng: random.Random,
) -> AttemptEnd:
    """The job after its attempt `attempt` ended: finished, failed, cancelled, or back to pending."""
    job = _current(stored, attempt)
    if job is None:
        return AttemptEnd(None, None, None)
    spec = job.spec or {}
    decision = retry_decision(
        outcome,
        job.preemptions,
        job.infra_failures,
        budgets,
        spec.get("max_preemptions"),
        spec.get("max_infra_retries"),
        now,
        rng,
        retry_on_infrastructure_failure=spec.get("retry_on_infrastructure_failure", True),
    )
    if job.cancel_requested and decision.next_state is JobState.pending:
        # Its cancel was asked (`tpuq cancel`, `tpuq fleet drain --now`), and the TPU went first: never run it again.
        decision = RetryDecision(JobState.cancelled, None, job.cancel_reason or "cancelled")
    try:
        state = transition(job.state, decision.event)
    except IllegalTransition:
        return AttemptEnd(None, None, None)  # the attempt already ended: only the first report counts
    fields: Doc = JobDoc.fields(state=state, updated_at=now, cancel_requested=False)
    if state is JobState.pending:
        if outcome is AttemptOutcome.preempted:
            fields |= JobDoc.fields(preemptions=job.preemptions + 1)
        else:
            fields |= JobDoc.fields(infra_failures=job.infra_failures + 1)
        fields |= JobDoc.fields(
            not_before=decision.not_before,
            # The attempt may have written checkpoints in its region: retries stay there.
            pinned_region=job.pinned_region or job.region,
            reason=f"{decision.reason}: {detail}" if detail else decision.reason,
            tpu=None,
            gang=[],
            pending_since=now,  # a new pending spell (tpuq.scheduler.notices: `pending`)
        )
    else:
        reason = detail if outcome in (AttemptOutcome.failed, AttemptOutcome.failed_setup) and detail else None
        fields |= JobDoc.fields(reason=reason or decision.reason, finished_at=now)
        if state is JobState.cancelled and job.cancel_reason:
            fields |= JobDoc.fields(reason=job.cancel_reason)
    attempt_fields = AttemptDoc.fields(state=AttemptState.ended, outcome=outcome, detail=detail, ended_at=now)
    return AttemptEnd(fields, attempt_fields, decision)


# ------------------------------------------------------ assignments never started

# An attempt the executor never starts (its SSH key not mounted, a crash loop, 429s) would otherwise stay `assigned`
# for ever: its slice busy, so never idle-deleted, and billed by the hour. It ends `infra_failed` once BOTH hold:
# - UNSTARTED_FOR (20 minutes) since it was assigned. A slow but healthy start fits in one push to the executor:
#   Cloud Run cuts a push off at the executor's request timeout (a 504, and Pub/Sub redelivers it:
#   production-facts.md, "Cloud Run in front of a push endpoint"), which deploy sets to the assignments
#   subscription's ack deadline (600 s, tpuq.contracts.topology), and that covers the wait for the workers' host keys (180 s,
#   `executor.ssh` host_key_wait_seconds), the SSH fan-out and the bundle's download. 20 minutes is two whole
#   pushes, so a start that ran out one push and succeeded on Pub/Sub's redelivery is kept.
# - UNSTARTED_REPUBLISHES (3) republishes, 4 sends in all (the tick sends one every 5 minutes,
#   `Settings.republish_assignment_after`): an executor that lost the first copy, or restarted, was offered it
#   again. Counted as well as timed, so ticks that stopped for an hour end nothing that was sent only once.
UNSTARTED_FOR = timedelta(minutes=20)
# An executor that recorded `starting` this lately may still be preparing the workers (one push, bounded by the
# executor subscription's 600 s ack deadline, tpuq.contracts.topology): not ended under it. An older `starting` record is a
# start that died, and counts as not started.
STARTING_FOR = timedelta(minutes=10)
UNSTARTED_REPUBLISHES = 3


@dataclass(frozen=True)
class UnstartedAssignment:
    republish: Doc | None = None  # the job's fields when its assignment (its cancel, once one was asked) is sent again
    end: AttemptEnd | None = None  # its attempt's end (infra_failed): the executor never started it
    detail: str | None = None  # why it ended, as the job's reason says


def unstarted_assignment(stored: Doc | None, execution: Doc | None, now: datetime, republish_after: timedelta,
                         budgets: RetryBudgets, rng: random.Random) -> UnstartedAssignment:
    """What the tick does with a job whose attempt is still `assigned`: nothing yet, send its assignment again, or
    end the attempt `infra_failed` (retried on the job's infrastructure budget, like any infra failure).

    `execution` is the executor's record of the attempt (executions/{job}:{attempt}, None when it has none). An
    attempt it recorded `started` runs (its `started` event was lost: a republish makes it publish one again), and
    one it recorded as ended is applied by the ended-attempt backstop: neither is ended here. The job must still
    be `assigned`, so a `started` event that won the race to the job document keeps the attempt."""
    if stored is None:
        return UnstartedAssignment()
    job = JobDoc.from_doc(stored)
    if job.state is not JobState.assigned or job.assigned_at is None or now - job.assigned_at < republish_after:
        return UnstartedAssignment()
    record = execution or {}
    received = record.get(ExecutionDoc.field("received_at"))
    starting_now = (record.get("state") == ExecutionState.starting and isinstance(received, datetime)
                    and now - received < STARTING_FOR)
    executor_has_it = (record.get("state") == ExecutionState.started or starting_now
                       or ExecutionEnd.from_doc(execution) is not None)
    if (not executor_has_it and job.assignment_republishes >= UNSTARTED_REPUBLISHES
            and now - job.assigned_at >= UNSTARTED_FOR):
        detail = never_started_detail(job)
        end = attempt_ended(stored, job.attempt, AttemptOutcome.infra_failed, detail, budgets, now, rng)
        return UnstartedAssignment(end=end, detail=detail) if end.job else UnstartedAssignment()
    last = job.assignment_republished_at
    if last is not None and last > now - republish_after:
        return UnstartedAssignment()  # sent again lately
    return UnstartedAssignment(republish=JobDoc.fields(assignment_republished_at=now,
                                                       assignment_republishes=job.assignment_republishes + 1))


def abandoned_record(stored: Doc, detail: str | None, now: datetime) -> Doc:
    """The executor's record (executions/{job}:{attempt}) of an attempt the tick ended unstarted: ended, so that a
    copy of its assignment the executor receives later is dropped, not run beside the retry."""
    job = JobDoc.from_doc(stored)
    end = ExecutionEnd(outcome=AttemptOutcome.infra_failed.value, detail=detail, ended_at=now)
    return {**ExecutionDoc.fields(job_id=job.id, attempt=job.attempt, attempt_id=job.attempt_id, node=job.tpu,
                                  ended_by="scheduler"), **end.to_doc()}


def never_started_detail(job: JobDoc) -> str:
    assert job.assigned_at is not None
    sends = job.assignment_republishes + 1
    return (f"the executor never started attempt {job.attempt_id}: assigned at {_utc(job.assigned_at)}, "
            f"sent {sends} time{'s' if sends != 1 else ''}")


def _utc(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ cancel


@dataclass(frozen=True)
class CancelDecision:
    job: Doc | None
    withdraw_request_id: str | None = None
    stop_attempt: bool = False  # tell the executor to stop the running attempt


def cancel(stored: Doc, reason: str, now: datetime, if_pending: bool = False,
           expected_attempt: int | None = None) -> CancelDecision:
    """`if_pending`: only a job still pending, and (with `expected_attempt`) never assigned since the CLI read it."""
    job = JobDoc.from_doc(stored)
    state = job.state
    if if_pending and not still_unstarted(stored, expected_attempt):
        return CancelDecision(None)  # it started: `tpuq cancel --if-pending` leaves it alone
    try:
        cancelled = transition(state, JobEvent.cancel)
    except IllegalTransition:
        return CancelDecision(None)  # already terminal
    if state is JobState.pending:
        return CancelDecision(
            JobDoc.fields(state=cancelled, reason=reason, capacity_request=None, waiting=None, finished_at=now,
                          updated_at=now),
            withdraw_request_id=job.capacity_request_id,
        )
    # assigned / running: the executor stops it and reports `ended cancelled`, which ends the job
    # through the same edge; until then the job keeps its state.
    fields = None
    if not job.cancel_requested:
        fields = JobDoc.fields(cancel_requested=True, cancel_reason=reason, updated_at=now)
    return CancelDecision(fields, stop_attempt=True)


# --------------------------------------------------------------- node lost


NODE_LOST = frozenset({FleetEventKind.suspended, FleetEventKind.gone, FleetEventKind.failed})


def node_is_lost(event: FleetEvent) -> bool:
    """SUSPENDED / GONE / FAILED naming a node: the slice is no more."""
    return event.kind in NODE_LOST and bool(event.node)


def request_failure_reason(event: FleetEvent) -> str | None:
    """One zone's queued resource failed before it had a node. The claimer races on in the others (and backs
    off or drops this one), so the job keeps its request; this says why it waits. None: not such an event."""
    if event.kind is not FleetEventKind.failed or not event.request_id or event.node:
        return None
    where = f"{event.type} in {event.zone}"
    short = {  # known classes in a few words; the API's text is in `tpuq fleet --verbose` / `--json`
        FailureClass.project: f"{where}: the project refuses new TPUs (`tpuq fleet` says why and what to run)",
        FailureClass.capacity: f"{where}: no capacity now (stockout); {RACING_ON}",
        FailureClass.zone_quota: f"{where}: no quota left there (`tpuq fleet` says what to do)",
        FailureClass.expired: f"{where}: the request expired while queued; {ASKING_AGAIN}",
        FailureClass.network: f"{where}: the fleet's subnetwork does not exist in region {zone_region(event.zone)} "
                              "(subnets are regional); the region is dropped (`tpuq fleet` says what to run)",
        FailureClass.external_ip_quota: f"{where}: the region's external IP quota is used up (`tpuq fleet` says "
                                        "what to change)",
    }.get(event.failure_class)
    if short:
        return short
    cause = event.failure_class.value if event.failure_class else "unknown"
    return f"capacity request failed in {event.zone} ({cause}): {event.failure_message}"


@dataclass(frozen=True)
class NodeLost:
    tpu: Doc | None  # the TPU's fields: gone
    end: AttemptEnd | None = None  # the end of the attempt it held, counted as preempted
    job_moved: bool = False  # the TPU changed hands since it was read: read again


def node_lost(tpu: Doc | None, holder_read: str | None, stored_job: Doc | None, event: FleetEvent,
              budgets: RetryBudgets, now: datetime, rng: random.Random,
              recorded_ends: Mapping[int, ExecutionEnd] | None = None) -> NodeLost:
    """SUSPENDED / GONE / FAILED for a node: the TPU is gone, and the attempt it held ends preempted (once),
    unless the executor recorded that attempt's end (`recorded_ends`, by attempt: executions/{job}:{attempt}):
    an attempt that ended (say, succeeded) before its slice went, whose `ended` event is still on its way or was
    lost, ends as it ended.

    `holder_read` is the job id the TPU named when the caller chose which job document to read with it.
    """
    stored = tpu or {}
    if stored.get("job_id") != holder_read:
        return NodeLost(None, job_moved=True)
    gone = tpu_on_gone(tpu, event, now)
    job = JobDoc.from_doc(stored_job) if stored_job else None
    if job is None or not stored.get("attempt_id") or job.attempt_id != stored["attempt_id"]:
        return NodeLost(gone)
    recorded = (recorded_ends or {}).get(job.attempt)
    if recorded is not None:
        end = attempt_ended(stored_job, job.attempt, AttemptOutcome(recorded.outcome), recorded.detail, budgets,
                            now, rng)
    else:
        # A GONE after the SUSPENDED this TPU recorded is still the preemption (tpus.lost_node_detail's words).
        recorded_gone = stored.get(TpuDoc.field("gone_reason"))
        kind = recorded_gone if lost_by_preemption(recorded_gone) else event.kind.value
        end = attempt_ended(stored_job, job.attempt, AttemptOutcome.preempted,
                            lost_node_detail(stored.get("short"), kind, event.failure_message), budgets, now, rng)
    return NodeLost(gone, end)


def suspect_reason(attempt_id: str, outcome: AttemptOutcome, detail: str | None = None) -> str | None:
    """Why a TPU is not to be trusted again after this end (see `tpu_freed`); None when it is. With the first line of
    the end's detail, so that the quarantine names its cause ("preflight failed: worker 2: /dev/vfio/0 is held by
    pid 4711 (python3 train.py)", a known TPU runtime failure, an unhealthy node)."""
    if outcome in (AttemptOutcome.preempted, AttemptOutcome.infra_failed):
        why = (detail or "").strip().split("\n", 1)[0]
        return f"attempt {attempt_id} ended {outcome.value}" + (f": {why}" if why else "")
    return None
