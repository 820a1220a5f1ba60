"""The scheduler service: shell (Firestore, Pub/Sub). Thin handlers from topics to the pure core.

Each handler decodes (the adapter did), loads the few documents it needs,
asks a pure function in `lifecycle` / `decide` what to do, commits
with preconditions and publishes. Every handler is idempotent: a redelivered
message, or an event for an attempt that is no longer current, writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.documents import (ExecutionEnd, JobDoc, JobState, TpuDoc, TpuState, execution_doc_id,
                                      short_node_name)
from tpuq.contracts.errors import Permanent, Retryable
from tpuq.contracts.fleet import FleetFile, RetryBudgets
from tpuq.runtime.guarded import WriteSet, commit_if_unchanged, read_decide_commit
from tpuq.runtime.isolation import Isolated
from tpuq.contracts.jobspec import PublishedJob, PublishedJobFile
from tpuq.contracts.messages import (
    AssignmentAction,
    AttemptEvent,
    AttemptEventKind,
    CancelRequest,
    FleetEvent,
    FleetEventKind,
    Tick,
)
from tpuq.scheduler import capacity, dependencies, intake, lifecycle, notices
from tpuq.scheduler.backstops import Backstop, claimed, decide_backstops
from tpuq.scheduler.gcs_submit import on_object_finalized
from tpuq.scheduler.counts import slices_recorded
from tpuq.scheduler.new_jobs import fleet_in_force, submit_jobs, whole_queue_pass
from tpuq.scheduler.passdue import (FOLLOWUP_DUE_FIELD, PASS_DUE_FIELD, followup_due, pass_due, replace_due,
                                    state_ref, with_tick_due)
from tpuq.scheduler.scheduling import (
    LiveSlices,
    read_live_slices,
    active_slices_not_recorded,
    any_job_pending,
    ended_attempts_not_applied,
    follow_up_unstarted_assignments,
    lost_slices_in_service,
    next_follow_up,
    note_request_failure,
    release_request,
    scheduling_pass,
)
from tpuq.runtime.clients import Clients
from tpuq.runtime.service import Context, Service
from tpuq.runtime.settings import Settings

log = logging.getLogger("tpuq.scheduler")


def _budgets(fleet: FleetFile | None) -> RetryBudgets:
    return fleet.retry if fleet else RetryBudgets()


def _jobs(ctx: Context):
    return ctx.clients.firestore.collection(store.JOBS)


def _tpus(ctx: Context):
    return ctx.clients.firestore.collection(store.TPUS)


# -------------------------------------------------------------------- jobs


def on_job(submission: PublishedJob | PublishedJobFile, ctx: Context) -> None:
    source = ctx.attributes.get("source", "pubsub")
    fleet = fleet_in_force(ctx)
    if isinstance(submission, PublishedJobFile):
        submit_jobs(ctx, intake.file_jobs(submission, ctx.message_id), source, fleet, from_file=True)
    else:
        submit_jobs(ctx, [submission], source, fleet)


# ------------------------------------------------------------ fleet events


def on_fleet_event(event: FleetEvent, ctx: Context) -> None:
    fleet = fleet_in_force(ctx)
    if event.kind is FleetEventKind.active:
        if not event.node:
            raise Permanent("an ACTIVE fleet event must name its node", field="node")
        _record_active(event, fleet, ctx)
        if event.slice_count > 1 and not _gang_recorded(event, ctx):
            return  # a slice of a multislice request: the event of its last slice recorded releases and plans
        if event.slice_count > 1:
            gang_ready(ctx.clients.firestore, event.queued_resource, ctx.now())
        if event.request_id:
            release_request(ctx, event.request_id)
            # The request is served: close it at the claimer too, so that when this slice is later
            # deleted as idle (or preempted) the claimer does not ask for it again. Demand that
            # remains comes back as a new request from a later pass.
            ctx.publish("capacity", capacity.withdrawal(event.request_id, event.fleet, ctx.now()))
        whole_queue_pass(ctx, fleet)
    elif event.kind is FleetEventKind.node_health:
        if event.node and _record_health(event, ctx):
            whole_queue_pass(ctx, fleet)  # an idle TPU healthy again may take a waiting job
    elif lifecycle.node_is_lost(event):
        if _record_node_lost(event, fleet, ctx):
            whole_queue_pass(ctx, fleet)
    elif (reason := lifecycle.request_failure_reason(event)) is not None:
        note_request_failure(ctx, event.request_id, reason)
    # PROVISIONING / WAITING_FOR_RESOURCES change nothing here.


def _record_active(event: FleetEvent, fleet, ctx: Context) -> None:
    ref = _tpus(ctx).document(short_node_name(event.node))

    def decide(tpu):
        return WriteSet().update(tpu, lifecycle.tpu_on_active(tpu.to_dict(), event, fleet, ctx.now())), None

    read_decide_commit(ctx.clients.firestore, [ref], decide)


def _gang_recorded(event: FleetEvent, ctx: Context) -> bool:
    """Whether every slice of the event's multislice queued resource is recorded. Until then a pass could give a
    part of the gang to an elastic job (or to single-slice jobs) and its request would look served. Each slice's
    handler counts after its own write, so the last of them (or both of two at once) sees them all."""
    return slices_recorded(ctx.clients.firestore, event.queued_resource) >= event.slice_count


def gang_ready(db, queued_resource: str, now) -> None:
    """Every slice of the queued resource is recorded: each may be offered to a job now (`gang_waiting` cleared)."""
    slices = db.collection(store.TPUS).where(filter=FieldFilter("queued_resource", "==", queued_resource))
    for ref in [snap.reference for snap in slices.stream()
                if (snap.to_dict() or {}).get(TpuDoc.field("gang_waiting"))]:

        def decide(tpu):  # read again and retried on a conflict: a flag left set would keep the slice from any job
            waiting = (tpu.to_dict() or {}).get(TpuDoc.field("gang_waiting"))
            return WriteSet().update(tpu, TpuDoc.fields(gang_waiting=False, updated_at=now) if waiting else None), None

        read_decide_commit(db, [ref], decide)


def _record_health(event: FleetEvent, ctx: Context) -> bool:
    """tpus/{node}.node_health; True when an idle TPU's record changed (a pass may now use it)."""
    ref = _tpus(ctx).document(short_node_name(event.node))

    def decide(tpu):
        doc = tpu.to_dict()
        fields = lifecycle.tpu_on_health(doc, event, ctx.now())
        return WriteSet().update(tpu, fields), bool(fields) and (doc or {}).get("state") == TpuState.idle

    return read_decide_commit(ctx.clients.firestore, [ref], decide)


def _record_node_lost(event: FleetEvent, fleet, ctx: Context) -> bool:
    """TPU -> gone; an attempt on it counts as preempted (once). True if a job went back to pending, or one of the
    fleet's TPUs is gone: its place in the fleet's count is free, and a job held back by the count (the job whose
    attempt failed on it, a dirty host, an unhealthy node) may ask for a fresh slice now rather than at the next
    backstop pass."""
    db = ctx.clients.firestore
    tpu_ref = _tpus(ctx).document(short_node_name(event.node))
    for _ in range(3):
        holder = (tpu_ref.get().to_dict() or {}).get("job_id")
        others = _other_slices(ctx, holder, event.node) if holder else []
        refs = [tpu_ref] + ([_jobs(ctx).document(holder)] if holder else []) + others
        recorded = _recorded_end(db, holder, ctx) if holder else {}
        recorded_tpu: list[bool] = []  # the TPU was one of the fleet's (any state): its place is free now
        held: list = []  # the holder's job as read, and its attempt (for its notices)

        def decide(tpu_snap, job_snap=None, *other_snaps, holder=holder, recorded=recorded,
                   recorded_tpu=recorded_tpu, held=held):
            recorded_tpu[:] = [tpu_snap.to_dict() is not None]
            job = job_snap.to_dict() if job_snap else None
            held[:] = [job]
            tpu = tpu_snap.to_dict()
            lost = lifecycle.node_lost(tpu, holder, job, event, _budgets(fleet), ctx.now(), ctx.rng, recorded)
            writes = WriteSet().update(tpu_snap, lost.tpu)
            if lost.end:
                attempt = JobDoc.from_doc(job, job_snap.id).attempt
                attempt_ref = job_snap.reference.collection(store.ATTEMPTS).document(str(attempt))
                writes.update(job_snap, lost.end.job).merge(attempt_ref, lost.end.attempt)
                # A multislice attempt ends on every slice with the one lost. Its queued resource is lost as a whole
                # (one state for all its slices: SUSPENDED, FAILED, gone), so the others are freed quarantined: their
                # own events are on the way, and a retry placed on them meanwhile would be preempted again.
                why = f"another slice of its queued resource was lost ({event.kind.value})"
                for other in other_snaps:
                    writes.update(other, lifecycle.tpu_freed(other.to_dict(), (tpu or {}).get("attempt_id") or "",
                                                             ctx.now(), why))
            return writes, lost

        lost = read_decide_commit(db, refs, decide)
        if not lost.job_moved:
            teller = notices.Teller(ctx, fleet)
            if lost.end is not None and held and held[0]:
                teller.attempt_ended(held[0], lost.end.job, JobDoc.from_doc(held[0], holder).attempt)
            requeued = bool(lost.end and lost.end.job and _requeued(lost.end.job))
            # Out of retries, it ended: its waiters move on (the pass runs them) or are cancelled naming it.
            released = (dependencies.look_at_waiters(db, holder, ctx.now(), teller)
                        if holder and lost.end and lost.end.job and _ended(lost.end.job) else [])
            # A TPU gone frees its place in its entry's count (idle past its timeout, or quarantined), whether this
            # event recorded it or the janitor's delete did first (`mark_gone`, which may land before this event is
            # handled): either way the pass runs now, for a job held back by the count.
            return requeued or bool(released) or bool(recorded_tpu and recorded_tpu[0])
    raise Retryable(f"TPU {event.node} keeps changing hands")


def _other_slices(ctx: Context, job_id: str, node: str) -> list:
    """The TPU documents of the job's current multislice attempt other than `node`'s ([] on one slice): its gang,
    read from the job (a gang does not change within an attempt; each free checks the attempt id)."""
    return _gang_refs(ctx, _jobs(ctx).document(job_id).get().to_dict(), job_id, node)


def _gang_refs(ctx: Context, stored: dict | None, job_id: str, node: str) -> list:
    if not stored:
        return []
    return [_tpus(ctx).document(short_node_name(name)) for name in JobDoc.from_doc(stored, job_id).gang
            if short_node_name(name) != short_node_name(node)]


def _recorded_end(db, job_id: str, ctx: Context) -> dict[int, ExecutionEnd]:
    """The end the executor recorded for the job's current attempt, if any, by attempt number (an end once recorded
    never changes: read outside the guarded commit, and used only if the job is still on that attempt)."""
    stored = _jobs(ctx).document(job_id).get().to_dict()
    attempt = JobDoc.from_doc(stored, job_id).attempt if stored else None
    if not attempt:
        return {}
    record = db.collection(store.EXECUTIONS).document(execution_doc_id(job_id, attempt)).get()
    end = ExecutionEnd.from_doc(record.to_dict())
    return {attempt: end} if end is not None else {}


def _ended(job_fields: dict) -> bool:
    """The job's writes end it (succeeded, failed, cancelled, rejected): its waiters may move on."""
    state = job_fields.get(JobDoc.field("state"))
    return state is not None and JobState(state).terminal


def _requeued(job_fields: dict) -> bool:
    """The job's writes send it back to the queue."""
    return job_fields.get(JobDoc.field("state")) == JobState.pending


# ---------------------------------------------------------- attempt events


def on_attempt_event(event: AttemptEvent, ctx: Context) -> None:
    db = ctx.clients.firestore
    job_ref = _jobs(ctx).document(event.job_id)
    attempt_ref = job_ref.collection(store.ATTEMPTS).document(str(event.attempt))
    if event.kind is AttemptEventKind.started:

        def decide_started(job):
            job_fields, attempt_fields = lifecycle.attempt_started(job.to_dict(), event.attempt, event.at, ctx.now())
            return WriteSet().update(job, job_fields).merge(attempt_ref, attempt_fields), None

        read_decide_commit(db, [job_ref], decide_started)
        dependencies.look_at_waiters(db, event.job_id, ctx.now())  # "waiting for train-3 (running)"
        return

    if event.outcome is None:
        raise Permanent("an ended attempt event needs an outcome", field="outcome")
    fleet = fleet_in_force(ctx)
    tpu_ref = _tpus(ctx).document(short_node_name(event.node))

    def decide_ended(job, tpu, *other_tpus):
        now = ctx.now()
        stored = job.to_dict()
        end = lifecycle.attempt_ended(stored, event.attempt, event.outcome, event.detail, _budgets(fleet), now,
                                      ctx.rng)
        suspect = lifecycle.suspect_reason(event.attempt_id, event.outcome, event.detail)
        freed = lifecycle.tpu_freed(tpu.to_dict(), event.attempt_id, now, suspect)
        writes = WriteSet().update(job, end.job).merge(attempt_ref, end.attempt).update(tpu, freed)
        for other in other_tpus:  # a multislice attempt: every slice of it, alike
            writes.update(other, lifecycle.tpu_freed(other.to_dict(), event.attempt_id, now, suspect))
        return writes, (end, freed, stored)

    # A multislice attempt's other slices are known once the job is read (a single slice reads nothing more).
    end, freed, stored = read_decide_commit(
        db, [job_ref, tpu_ref], decide_ended,
        then=lambda snaps: _gang_refs(ctx, snaps[0].to_dict(), event.job_id, event.node))
    teller = notices.Teller(ctx, fleet)
    teller.attempt_ended(stored, end.job, event.attempt)  # (again on a redelivery: the same event ids)
    log.info("attempt %s ended %s: job %s, TPU %s", event.attempt_id, event.outcome.value,
             end.job[JobDoc.field("state")] if end.job else "unchanged", "freed" if freed else "unchanged")
    # The jobs waiting on this one are looked at at once (tpuq.scheduler.dependencies): met ones are planned now,
    # never-met ones cancelled naming it.
    released = (dependencies.look_at_waiters(db, event.job_id, ctx.now(), teller, stored or {})
                if end.job and _ended(end.job) else [])
    if freed or (end.job and _requeued(end.job)):
        whole_queue_pass(ctx, fleet, released)
    elif released:
        scheduling_pass(ctx, fleet, trigger_job_ids=released)


# ------------------------------------------------------------------ cancel


def on_cancel(request: CancelRequest, ctx: Context) -> None:
    db = ctx.clients.firestore
    job_ref = _jobs(ctx).document(request.job_id)

    def decide(job):
        if not job.exists:
            raise Permanent(f"no job {request.job_id!r} is stored", field="job_id")
        decision = lifecycle.cancel(job.to_dict(), request.reason, ctx.now(), request.if_pending,
                                    request.expected_attempt)
        return WriteSet().update(job, decision.job), (decision, job.to_dict())

    decision, job = read_decide_commit(db, [job_ref], decide)
    fleet = fleet_in_force(ctx) if decision.withdraw_request_id else None
    teller = notices.Teller(ctx, fleet) if fleet is not None else notices.Teller(ctx)
    teller.ended({**job, **(decision.job or {})})  # cancelled now, or (a redelivery) as it ended
    if decision.withdraw_request_id and fleet is not None:
        ctx.publish("capacity", capacity.withdrawal(decision.withdraw_request_id, fleet.name, ctx.now()))
    # A pending job cancelled (or, on a redelivery, already ended): its waiters move on or are cancelled.
    if (decision.job and _ended(decision.job)) or JobDoc.from_doc(job, request.job_id).terminal:
        released = dependencies.look_at_waiters(db, request.job_id, ctx.now(), teller)
        if released:
            scheduling_pass(ctx, fleet_in_force(ctx), trigger_job_ids=released)
    if decision.stop_attempt:
        # Sent on every delivery: the executor stops an attempt id at most once, and a crash
        # after the write above must not lose the stop.
        ctx.publish("assignments", lifecycle.assignment_message(job, [], ctx.now(), AssignmentAction.cancel))


# -------------------------------------------------------------------- tick


def on_tick(tick: Tick, ctx: Context) -> None:
    """Backstops, then a full pass; each part isolated, so one that fails never stops the others.

    The backstops for lost events run on their cadence (`backstops`), not on every tick; the follow-up of
    unstarted assignments and the full pass run only when due (`passdue`) or nudged (`Tick.nudge`: a person's
    change, such as a fleet file applied), the pass only with a job pending. A quiet tick reads
    `tick_due/scheduler` alone (routed only when it is due: `tpuq.runtime.tickdue`)."""
    parts = Isolated("scheduler tick", log)
    fleets: list[FleetFile | None] = []

    def fleet() -> FleetFile | None:
        """The fleet, read at most once a tick, and only by a part that needs it (a quiet tick does not)."""
        if not fleets:
            fleets.append(fleet_in_force(ctx))
        return fleets[0]

    due: list[Backstop] = []
    state: dict | None = None
    with parts.part("claiming the backstops due"):
        due, state = _claim_due_backstops(ctx)
    with parts.part("following up assignments not started"):
        # Sent again, or (sent often enough, long enough ago) ended infra_failed: the pass below then retries
        # the job and the janitor deletes its quarantined TPU. Only when one may be due (`passdue`).
        if state is None or followup_due(state, ctx.now()):
            follow_up_unstarted_assignments(ctx, lambda: _budgets(fleet()))
            if state is not None:
                after = ctx.settings.republish_assignment_after
                replace_due(ctx.clients.firestore, FOLLOWUP_DUE_FIELD, state,
                            next_follow_up(ctx.clients.firestore, after), ctx.now(), ctx.settings.backstop_every)
    # In this order: an attempt that ended (say, succeeded) before its slice went counts as it ended, not as
    # preempted by the slice's loss.
    slices: list[LiveSlices | None] = [None]
    if {Backstop.active_slices, Backstop.lost_slices} <= set(due):
        with parts.part("reading the live slices"):
            slices[0] = read_live_slices(ctx.clients.firestore)  # both slice backstops' reads, once
    for backstop in (b for b in _BACKSTOP_RUNS if b.backstop in due):
        found: list = []
        with parts.part(backstop.reading):
            found = backstop.read(ctx, slices[0])
        for event in found:
            log.warning("tick: %s", backstop.says(event))
            with parts.part(f"applying {backstop.says(event)}"):
                backstop.apply(event, ctx)
    with parts.part("the scheduling pass"):
        # Only when time may have changed an answer, or on the cadence (tpuq.scheduler.passdue): every change
        # an event announces ran its own pass.
        if (tick.nudge or state is None or Backstop.full_pass in due or pass_due(state, ctx.now())) \
                and any_job_pending(ctx.clients.firestore):
            report = scheduling_pass(ctx, fleet(), full=True, record_due=False)
            if state is not None:
                replace_due(ctx.clients.firestore, PASS_DUE_FIELD, state, report.next_due, ctx.now(),
                            ctx.settings.backstop_every)
        elif state is not None and pass_due(state, ctx.now()):
            replace_due(ctx.clients.firestore, PASS_DUE_FIELD, state, None, ctx.now(),  # its jobs are gone
                        ctx.settings.backstop_every)
    parts.raise_if_any()


@dataclass(frozen=True)
class _BackstopRun:
    """A backstop for a lost event: how it reads what the event left behind, and the handler that applies the
    event it rebuilds (the same handler the event would have reached)."""

    backstop: Backstop
    reading: str
    read: Callable[[Context, LiveSlices | None], list]
    says: Callable[[Any], str]
    apply: Callable[[Any, Context], None]


_BACKSTOP_RUNS = (
    _BackstopRun(Backstop.active_slices, "reading slices without a TPU record",
                 lambda c, slices: active_slices_not_recorded(c, slices=slices),
                 lambda e: f"recording {e.node}, whose ACTIVE event never arrived",
                 lambda e, c: on_fleet_event(e, c)),
    # The executor published this end, but the event never arrived (dead-lettered after an outage): apply the
    # outcome it recorded, through the same handler, so the job and its TPU move on.
    _BackstopRun(Backstop.ended_attempts, "reading recorded attempt ends",
                 lambda c, _: ended_attempts_not_applied(c),
                 lambda e: f"the recorded end of {e.attempt_id} ({e.outcome.value}), whose event never arrived",
                 lambda e, c: on_attempt_event(e, c)),
    _BackstopRun(Backstop.lost_slices, "reading TPUs in service whose slice is gone",
                 lambda c, slices: lost_slices_in_service(c, slices=slices),
                 lambda e: f"{e.node} {e.kind.value} at the claimer, whose event never arrived",
                 lambda e, c: on_fleet_event(e, c)),
)


def _claim_due_backstops(ctx: Context) -> tuple[list[Backstop], dict]:
    """The backstops this tick runs: those due (`backstops.decide_backstops`), claimed by one guarded write of
    `tick_due/scheduler` (with the `due_at` they make); none when another instance's claim won. And the state document as read."""
    db = ctx.clients.firestore
    snap = state_ref(db).get()
    now, every = ctx.now(), ctx.settings.backstop_every
    state = snap.to_dict() or {}
    due = decide_backstops(state, now, every)
    if due and not commit_if_unchanged(db, WriteSet().update(snap, with_tick_due(state, claimed(due, now), now,
                                                                                 every))):
        return [], state  # another instance claimed them meanwhile: it runs them
    return due, state


# The route table: each push subscription's path (tpuq.contracts.topology) to its handler.
ROUTES = {
    "/push/jobs": on_job,
    "/push/fleet-events": on_fleet_event,
    "/push/attempt-events": on_attempt_event,
    "/push/cancels": on_cancel,
    "/push/ticks": on_tick,
    "/push/gcs-submit": on_object_finalized,
}


def build_service(settings: Settings, clients: Clients | None = None) -> Service:
    """The scheduler keeps no state of its own between messages: everything it knows is in Firestore."""
    return Service(name="scheduler", routes=ROUTES, settings=settings,
                   clients=clients if clients is not None else Clients(settings))
