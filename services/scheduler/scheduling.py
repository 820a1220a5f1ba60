"""The scheduling pass: shell (Firestore reads and guarded writes, Pub/Sub publishes).

A pass has three phases over one snapshot: `read_snapshot` reads everything
it decides on, `decide.decide_pass` (pure) decides the assignments and the
capacity asks, and `_apply` commits and publishes them.

A pass reads only what it needs, through indexed queries (see
infra/firestore.indexes.json): idle TPUs, then, for each type an idle TPU or a
fleet entry has, the first pending jobs in queue order that accept that type
(or, for a newly stored job, just that job), and counts the live TPUs and open
requests of the fleet entries its waiting jobs could ask from. Its reads grow
with the fleet (types x idle TPUs + a bound), never with the queue's length: a
long queue of jobs for a type with no capacity hides no job another type could run. A pass writes only the
job and TPU pairs it assigns and the jobs it asks capacity for; no document is
written by every pass.

Two scheduler instances may run the same pass at once and plan the same pairs.
Each pair is committed with preconditions on both documents
(`tpuq.runtime.guarded.commit_if_unchanged`), so one wins and the other's commit fails
at once; the loser plans again on fresh reads (a bounded number of rounds)
when a lost pair left its job or TPU free.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Iterable

from google.cloud.firestore import FieldFilter, Query

from tpuq.contracts import store
from tpuq.contracts.documents import (
    JOB_STATES_ON_A_TPU,
    TPU_STATES_IN_SERVICE,
    ExecutionEnd,
    JobDoc,
    JobState,
    NodeHealth,
    QueuedResourceState,
    TpuState,
    execution_doc_id,
    short_node_name,
)
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile, RetryBudgets
from tpuq.runtime.fleetstore import paused_fleets
from tpuq.runtime.guarded import WriteSet, commit_if_unchanged, read_decide_commit
from tpuq.contracts.messages import (AssignmentAction, AttemptEvent, AttemptEventKind, AttemptOutcome, FleetEvent,
                                     FleetEventKind, WorkerEndpoint)
from tpuq.contracts.jobspec import ANY_TPU
from tpuq.contracts.tputypes import canonical_name, parse_accelerator_type
from tpuq.scheduler import capacity, dependencies, gangs, grouplimit, lifecycle, notices
from tpuq.scheduler.counts import live_tpus_of, open_requests_of
from tpuq.scheduler.decide import PassDecision, PassSnapshot, decide_pass, entries_to_count, queue_from, queued
from tpuq.scheduler.passdue import FOLLOWUP_DUE_FIELD, PASS_DUE_FIELD, lower_dues, next_pass_due
from tpuq.runtime.versioned import versioned
from tpuq.runtime.service import Context

log = logging.getLogger("tpuq.scheduler")

# Pending jobs read per type beyond the idle TPUs of that type: room for jobs ahead in the queue that cannot
# take them (a zone, a region, a named node, a retry back-off) and for the type's capacity asks.
PER_TYPE_EXTRA = 64
IDLE_LIMIT = 2000
MAX_ROUNDS = 3  # plan again after losing pairs to another instance, at most this often per message


@dataclass
class PassReport:
    assigned: int = 0
    lost: int = 0
    requested: int = 0
    withdrawn: int = 0
    rounds: int = 0
    jobs_read: int = 0
    tpus_read: int = 0
    seconds: float = 0.0
    next_due: datetime | None = None  # when time may change this pass's answer (tpuq.scheduler.passdue)


# ------------------------------------------------------------------ reads


def idle_tpu_snapshots(db) -> list:
    q = db.collection(store.TPUS).where(filter=FieldFilter("state", "==", TpuState.idle)).limit(IDLE_LIMIT)
    return list(q.stream())


def pending_jobs_for_type(db, tpu_type: str, limit: int) -> list:
    """The first `limit` pending jobs in queue order that accept `tpu_type` (their stored `types` name it, or
    `any`): one indexed query (state, types, priority_rank, submit_time)."""
    q = (
        db.collection(store.JOBS)
        .where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.pending))
        .where(filter=FieldFilter(JobDoc.field("types"), "array_contains_any", sorted({tpu_type, ANY_TPU})))
        .order_by(JobDoc.field("priority_rank"), direction=Query.DESCENDING)
        .order_by(JobDoc.field("submit_time"))
    )
    return grouplimit.read_past_held(q, limit)  # (a group's tasks past its limit hide no job behind them)


def pending_job_snapshots(db, tpu_docs: list[dict], fleet: FleetFile | None) -> list:
    """The pending jobs a pass over the whole queue considers: per type, bounded (`types_to_read`)."""
    found: dict[str, object] = {}
    for tpu_type, limit in types_to_read(tpu_docs, fleet).items():
        for snap in pending_jobs_for_type(db, tpu_type, limit):
            found.setdefault(snap.id, snap)
    return list(found.values())


def types_to_read(tpu_docs: list[dict], fleet: FleetFile | None) -> dict[str, int]:
    """TPU type -> how many pending jobs accepting it a pass reads: the idle TPUs of the type plus
    PER_TYPE_EXTRA, for every type an idle TPU has (what may be assigned now) or a fleet entry offers
    (what may ask for capacity)."""
    idle = Counter(canonical_name(d["type"]) for d in tpu_docs if d.get("type"))
    offered = {canonical_name(e.type) for e in fleet.tpus} if fleet else set()
    return {t: idle[t] + PER_TYPE_EXTRA for t in sorted(set(idle) | offered)}


def any_job_pending(db) -> bool:
    """Is any job pending? One indexed query of at most one document (one read billed): a tick's full pass with
    no pending job has nothing to decide (it assigns, asks and blocks only pending jobs), so it is not run."""
    q = db.collection(store.JOBS).where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.pending)).limit(1)
    return any(True for _ in q.stream())


def job_snapshots(db, job_ids: Iterable[str]) -> list:
    refs = [db.collection(store.JOBS).document(j) for j in dict.fromkeys(job_ids)]
    return [s for s in db.get_all(refs) if s.exists] if refs else []


def jobs_with_request(db, request_id: str) -> list:
    q = db.collection(store.JOBS).where(
        filter=FieldFilter(JobDoc.field("capacity_request", "id"), "==", request_id)).limit(10)
    return list(q.stream())


def _job_view(snap) -> JobDoc:
    return JobDoc.from_doc(snap.to_dict() or {}, snap.id)


def _parsed_view(job_id: str, doc: dict) -> JobDoc:
    return JobDoc.from_doc(doc, job_id)


def read_snapshot(db, fleet: FleetFile | None, trigger_job_ids: list[str],
                  full: bool, now: datetime | None = None, told=None) -> tuple[PassSnapshot, dict, dict]:
    """Phase 1: everything the pass decides on; and the snapshots its guarded writes are checked against.
    Each document is copied out of its snapshot once (`to_dict` copies the whole document, every time)."""
    paused = paused_fleets(db)  # `tpuq fleet pause`: its idle TPUs take no new job (the janitor deletes them)
    tpus = [(s, d) for s, d in _with_docs(idle_tpu_snapshots(db)) if d.get("fleet") not in paused]
    triggered = [s for s in job_snapshots(db, trigger_job_ids) if _is_pending(s)] if trigger_job_ids else []
    if trigger_job_ids and not full:
        job_snaps = triggered
    else:
        job_snaps = pending_job_snapshots(db, [d for _, d in tpus], fleet)
        # The full read is bounded per type: the jobs that triggered this pass are planned in it all the same.
        read = {s.id for s in job_snaps}
        job_snaps += [s for s in triggered if s.id not in read]
    if now is not None:  # a job waiting for its dependencies takes no TPU and asks for none (its reason is written)
        job_snaps = dependencies.hold_waiting(db, job_snaps, now, told)
    kept = versioned(db, "queued job", queued)  # each stored version copied and parsed once (module docstring)
    jobs = sorted(((s, *kept.get(s)) for s in job_snaps), key=_queue_order)
    # A group's tasks past its limit (`%K`) take no TPU and ask for none (their reason is written).
    held, held_reasons = grouplimit.held_in_pass(db, [(s.id, parsed) for s, _, parsed in jobs])
    queue = queue_from([(s.id, parsed) for s, _, parsed in jobs if s.id not in held])
    entries = entries_to_count(queue, fleet)
    snapshot = PassSnapshot(
        queue=queue,
        idle_tpus=[d for _, d in tpus],
        live_tpus={e: live_tpus_of(db, e) for e in entries},
        open_requests={e: open_requests_of(db, e) for e in entries},
        held=held_reasons,
    )
    return snapshot, {s.id: s for s, _, _ in jobs}, {d.get("name"): s for s, d in tpus}


def _with_docs(snaps) -> list[tuple]:
    return [(s, s.to_dict() or {}) for s in snaps]


def _queue_order(snap_and_doc: tuple) -> tuple:
    """Priority, then submit time, then id: the order the per-type reads are merged in (the matcher orders
    them again by its own key)."""
    snap, doc = snap_and_doc[:2]
    submitted = doc.get(JobDoc.field("submit_time"))
    return (-(doc.get(JobDoc.field("priority_rank")) or 0), submitted.timestamp() if submitted else 0.0, snap.id)


def _is_pending(snap) -> bool:
    """A triggering job still pending; one whose stored state no enum has is not (logged, as the pass skips it)."""
    try:
        return JobDoc.from_doc(snap.to_dict() or {}, snap.id).state is JobState.pending
    except Permanent as e:
        log.error("%s", e)
        return False


# ------------------------------------------------------------------- pass


def scheduling_pass(
    ctx: Context, fleet: FleetFile | None, trigger_job_ids: Iterable[str] = (), full: bool = False,
    record_due: bool = True,
) -> PassReport:
    """Read, decide (`decide.decide_pass`, pure), apply.

    With `trigger_job_ids` (a job was just stored) only those jobs are planned
    against the idle TPUs: any TPU idle before they arrived already had every
    older pending job offered to it and none fitted, so the new jobs are the
    only new demand. Otherwise (new or freed TPU, requeued job, tick) the
    whole queue is read; so it is when a new job would get an idle TPU (that
    TPU may have turned idle in another push whose pass has not run yet).
    """
    db = ctx.clients.firestore
    report = PassReport()
    started = time.monotonic()
    trigger_job_ids = list(trigger_job_ids)
    runner_bucket = ctx.clients.settings.runner_bucket or (fleet.runner_bucket if fleet else None)
    rounds = MAX_ROUNDS
    teller = notices.Teller(ctx, fleet)
    while report.rounds < rounds:
        report.rounds += 1
        snapshot, job_snaps, tpu_snaps = read_snapshot(db, fleet, trigger_job_ids, full, ctx.now(), teller)
        report.jobs_read += len(job_snaps)
        report.tpus_read += len(tpu_snaps)
        now = ctx.now()
        decision = decide_pass(snapshot, fleet, runner_bucket, now)
        report.next_due = next_pass_due(snapshot, now)
        if trigger_job_ids and not full and decision.assignments:
            # An idle TPU fits a new job. It may have turned idle after the older jobs were last offered one
            # (its own pass still to come, in another push): the whole queue decides who gets it, not the
            # new job alone.
            full = True
            rounds += 1  # a round planned again, not one lost to another instance
            continue
        lost = _apply(ctx, fleet, decision, job_snaps, tpu_snaps, now, report)
        if full:  # the pending jobs it read, past a destination's `pending_after` (no read of its own)
            placed = {a.job_id for a in decision.assignments} | {j for j, _, _ in decision.unassignable}
            report.next_due = notices.sooner(report.next_due, teller.pending(job_snaps.values(), placed,
                                                                             decision.blocked))
        if not lost or not _unresolved(db, lost):
            break
        full = True  # a pair was lost and its job or TPU is still free: plan again on fresh reads
    report.seconds = round(time.monotonic() - started, 3)
    # The tick's pass records its own pass due (it saw the whole queue: it replaces the instant).
    lower_dues(db, {PASS_DUE_FIELD: report.next_due if record_due else None,
                    FOLLOWUP_DUE_FIELD: ctx.now() + ctx.settings.republish_assignment_after if report.assigned
                    else None}, ctx.now(), ctx.settings.backstop_every)
    log.info("pass: %s", report)
    return report


def _unresolved(db, lost_pairs: list[tuple]) -> bool:
    """After losing pairs to another writer: is any of their jobs still pending, or TPUs still idle?

    Usually the other scheduler instance assigned exactly the same pair, and
    there is nothing left to plan.
    """
    refs = [ref for job_snap, tpu_snap in lost_pairs for ref in (job_snap.reference, tpu_snap.reference)]
    for snap in db.get_all(refs):
        doc = snap.to_dict() or {}
        if doc.get("state") in (JobState.pending, TpuState.idle):
            return True
    return False


def _apply(ctx: Context, fleet: FleetFile | None, decision: PassDecision, job_snaps: dict, tpu_snaps: dict,
           now, report: PassReport) -> list[tuple]:
    """Phase 3: commit each assignment, then the asks and blocked reasons; returns the pairs lost."""
    db = ctx.clients.firestore
    for job_id, why in decision.unreadable.items():
        log.error("job %s cannot be scheduled: %s", job_id, why)
    lost = []
    for job_id, tpu_name, fields in decision.unassignable:
        if fields:
            log.warning("job %s cannot be assigned: %s", job_id, fields.get("reason"))
            if commit_if_unchanged(db, WriteSet().update(job_snaps[job_id], fields)):  # (built by decide_pass)
                notices.Teller(ctx, fleet).ended({**(job_snaps[job_id].to_dict() or {}), **fields})
        report.lost += 1
        lost.append((job_snaps[job_id], tpu_snaps[tpu_name]))
    for planned in decision.assignments:
        job_snap, tpu_snap = job_snaps[planned.job_id], tpu_snaps[planned.tpu_name]
        if _assign(ctx, fleet, job_snap, [tpu_snap, *(tpu_snaps[n] for n in planned.writes.gang_tpus)],
                   planned.writes, report):
            report.assigned += 1
        else:
            report.lost += 1
            lost.append((job_snap, tpu_snap))
    for ask in decision.asks:
        _record_ask(ctx, fleet, job_snaps[ask.job_id], ask, now, report)
    for job_id, reason in decision.blocked.items():
        commit_if_unchanged(db, WriteSet().update(job_snaps[job_id], JobDoc.fields(blocked=reason, updated_at=now)))
    return lost


def _assign(ctx: Context, fleet: FleetFile | None, job_snap, tpu_snaps: list, writes: lifecycle.AssignmentWrites,
            report: PassReport) -> bool:
    """One guarded commit: the job, its attempt and every TPU it takes (a multislice job's gang: all or none)."""
    attempt_ref = job_snap.reference.collection(store.ATTEMPTS).document(str(writes.message.attempt))
    batch = WriteSet().update(job_snap, writes.job).merge(attempt_ref, writes.attempt)
    for tpu_snap in tpu_snaps:
        batch.update(tpu_snap, writes.tpu)
    if not commit_if_unchanged(ctx.clients.firestore, batch):
        return False
    # Published after the commit: only the winner tells the executor. If this publish is lost,
    # the tick's republish of long-assigned attempts is the backstop (the executor dedups attempt ids).
    ctx.publish("assignments", writes.message)
    log.info("assigned %s to %s", writes.message.attempt_id, writes.message.node)
    if writes.withdraw_request_id and fleet is not None:
        ctx.publish("capacity", capacity.withdrawal(writes.withdraw_request_id, fleet.name, writes.message.at))
        report.withdrawn += 1
    return True


def _record_ask(ctx: Context, fleet: FleetFile, snap, ask: capacity.Ask, now, report: PassReport) -> None:
    # Published before it is recorded: the id is deterministic, so a crash in between makes
    # the next pass publish the same request again, which the claimer sees as one.
    ctx.publish("capacity", ask.message)
    fields = JobDoc.fields(capacity_request=ask.record, capacity_requests=ask.n, blocked=None, updated_at=now)
    if commit_if_unchanged(ctx.clients.firestore, WriteSet().update(snap, fields)):
        report.requested += 1
        return
    if _spend_request_id(ctx.clients.firestore, snap.reference, ask):
        # The job moved on meanwhile (assigned, cancelled, asked under another id): take the request back.
        ctx.publish("capacity", capacity.withdrawal(ask.message.request_id, fleet.name, now))
        report.withdrawn += 1


def _spend_request_id(db, job_ref, ask: capacity.Ask) -> bool:
    """After an ask's record lost to another writer: True when the ask is to be withdrawn, with its number
    recorded as used first. The claimer never reopens a withdrawn id (a late copy of the request must not revive
    it), so a later ask of this job that reused the number would be recorded as open and never be served: the job
    would wait for ever (issue 31: a stale pass asked while another assigned the job; after the job's next
    requeue it asked again under the withdrawn id). False: another instance recorded this very ask; it stands."""

    def decide(job):
        view = _job_view(job)
        if view.capacity_request_id == ask.message.request_id:
            return WriteSet(), False
        spent = JobDoc.fields(capacity_requests=ask.n) if job.exists and view.capacity_requests < ask.n else None
        return WriteSet().update(job, spent), True

    return read_decide_commit(db, [job_ref], decide)


# ------------------------------------------------------- request bookkeeping


def release_request(ctx: Context, request_id: str, blocked: str | None = None) -> int:
    """The claimer served (or gave up on) `request_id`: the job no longer has it open.

    A later pass asks again (with the next id) if the job still waits, e.g.
    because the new TPU went to a job ahead of it in the queue.
    """
    db = ctx.clients.firestore
    released = 0
    for snap in jobs_with_request(db, request_id):
        fields = JobDoc.fields(capacity_request=None, updated_at=ctx.now())
        if blocked:
            fields |= JobDoc.fields(blocked=blocked)
        if commit_if_unchanged(db, WriteSet().update(snap, fields)):
            released += 1
    return released


def note_request_failure(ctx: Context, request_id: str, reason: str) -> None:
    """A racer of `request_id` failed: the waiting job shows why, and keeps its request."""
    db = ctx.clients.firestore
    for snap in jobs_with_request(db, request_id):
        commit_if_unchanged(db, WriteSet().update(snap, JobDoc.fields(blocked=reason[:2000], updated_at=ctx.now())))


RECONCILE_AFTER = timedelta(minutes=2)


def active_slices_not_recorded(ctx: Context, limit: int = 200, slices: "LiveSlices | None" = None) -> list[FleetEvent]:
    """Backstop for a lost ACTIVE event: slices the claimer has seen ACTIVE (its `queued_resources` record)
    that have no `tpus/{node}` document. Without this the slice would be neither used nor reaped. `slices`:
    what `read_live_slices` read for this tick (its TPUs in service are known without reading them again)."""
    db = ctx.clients.firestore
    slices = slices or read_live_slices(db, active_limit=limit, tpus_limit=0)
    records = [r for record in slices.active_records.values() for r in _per_slice(record)
               if r.get("node") and r.get("endpoints")]
    if not records:
        return []
    in_service = {short_node_name(d["name"]) for d in slices.tpus_in_service if d.get("name")}
    others = [r for r in records if short_node_name(r["node"]) not in in_service]
    refs = [db.collection(store.TPUS).document(short_node_name(r["node"])) for r in others]
    known = {short_node_name(r["node"]) for r in records} & in_service
    known |= {snap.id for snap in db.get_all(refs) if snap.exists} if refs else set()
    events = []
    for r in records:
        if short_node_name(r["node"]) in known:
            continue
        accel = parse_accelerator_type(r["type"])
        events.append(FleetEvent(
            kind=FleetEventKind.active, fleet=r["fleet"], queued_resource=r["name"], request_id=r.get("request_id"),
            zone=r["zone"], type=r["type"], node=r["node"], entry_id=r.get("entry_id"), chips=accel.chips,
            hosts=accel.hosts, spot=bool(r.get("spot", True)),
            endpoints=[WorkerEndpoint.model_validate(e) for e in r["endpoints"]], node_health=NodeHealth.from_doc(r),
            slice_index=r.get("slice_index"), slice_count=r.get("slice_count") or 1, at=ctx.now()))
    return events


def _per_slice(record: dict) -> list[dict]:
    """A claimer's queued-resource record as one record per slice: itself, or a multislice request's every slice
    (`slice_nodes`: its node, workers and health), each with its index and the gang's size."""
    nodes = record.get("slice_nodes") or []
    if not nodes:
        return [record]
    return [{**record, "node": n.get("name"), "endpoints": n.get("endpoints"), "node_health": n.get("node_health"),
             "slice_index": i, "slice_count": len(nodes)} for i, n in enumerate(nodes)]


@dataclass(frozen=True)
class LiveSlices:
    """What the two slice backstops both read, once a tick: the claimer's records of live ACTIVE queued
    resources (id -> record) and the TPUs in service here. Each backstop reads on its own only what these leave
    open (a TPU record not in service, a queued resource record not ACTIVE): usually nothing."""

    active_records: dict[str, dict]
    tpus_in_service: list[dict]


def read_live_slices(db, active_limit: int = 200, tpus_limit: int = IDLE_LIMIT) -> LiveSlices:
    active: dict[str, dict] = {}
    if active_limit:
        q = (db.collection(store.QUEUED_RESOURCES)
             .where(filter=FieldFilter("state", "==", QueuedResourceState.ACTIVE))
             .where(filter=FieldFilter("live", "==", True)).limit(active_limit))
        active = {s.id: s.to_dict() or {} for s in q.stream()}
    tpus: list[dict] = []
    if tpus_limit:
        q = db.collection(store.TPUS).where(filter=FieldFilter("state", "in", sorted(TPU_STATES_IN_SERVICE))) \
            .limit(tpus_limit)
        tpus = [s.to_dict() or {} for s in q.stream()]
    return LiveSlices(active, tpus)


# A fleet event's kind is the queued-resource state it announces: the recorded states that say a slice is no more.
_LOST_KIND_OF_STATE = {kind.value: kind for kind in lifecycle.NODE_LOST}


def lost_slices_in_service(ctx: Context, limit: int = IDLE_LIMIT, slices: LiveSlices | None = None) -> list[FleetEvent]:
    """Backstop for a lost SUSPENDED / FAILED / GONE event: TPUs still idle or busy here whose queued resource the
    claimer recorded (`queued_resources/{id}`) as suspended, failed or gone more than RECONCILE_AFTER ago. Without
    this such a TPU would be handed new jobs, and a job on it would wait for an end nobody reports. Returns the
    events to apply (the kind the claimer announced); applying one twice changes nothing (`lifecycle.node_lost`).
    `slices`: what `read_live_slices` read for this tick (a record it read ACTIVE is not read again)."""
    db = ctx.clients.firestore
    now = ctx.now()
    slices = slices or read_live_slices(db, active_limit=0, tpus_limit=limit)
    tpus = [d for d in slices.tpus_in_service if d.get("queued_resource") and d.get("name")]
    if not tpus:
        return []
    records = {i: r for i, r in slices.active_records.items()}
    unread = sorted({short_node_name(d["queued_resource"]) for d in tpus} - set(records))
    refs = [db.collection(store.QUEUED_RESOURCES).document(i) for i in unread]
    records |= {s.id: s.to_dict() or {} for s in db.get_all(refs) if s.exists} if refs else {}
    events = []
    for tpu in tpus:
        r = records.get(short_node_name(tpu["queued_resource"])) or {}
        nodes = {n.get("name") for n in r.get("slice_nodes") or []} or {r.get("node") or tpu["name"]}
        if r.get("name") != tpu["queued_resource"] or tpu["name"] not in nodes:
            continue  # not this TPU's record (for a multislice request: not one of its slices): only its own ends it
        kind = _LOST_KIND_OF_STATE.get(r.get("state"))  # the event the claimer announced for that state
        if kind is None or r.get("updated_at") is None or now - r["updated_at"] < RECONCILE_AFTER:
            continue  # live, unknown to the claimer, or recorded so lately that its event may still be on its way
        events.append(FleetEvent(
            kind=kind, fleet=tpu.get("fleet") or r["fleet"], queued_resource=tpu["queued_resource"],
            request_id=tpu.get("request_id") or r.get("request_id"), zone=tpu.get("zone") or r["zone"],
            type=tpu.get("type") or r["type"], node=tpu["name"], entry_id=tpu.get("entry_id") or r.get("entry_id"),
            at=now))
    return events


def ended_attempts_not_applied(ctx: Context, limit: int = 50) -> list[AttemptEvent]:
    """Backstop for a lost `ended` event: jobs still assigned/running a while after their last change whose
    attempt the executor has recorded as ended (`executions/{job}:{attempt}`). Returns the events to apply."""
    db = ctx.clients.firestore
    now = ctx.now()
    q = (
        db.collection(store.JOBS)
        .where(filter=FieldFilter(JobDoc.field("state"), "in", list(JOB_STATES_ON_A_TPU)))
        .where(filter=FieldFilter(JobDoc.field("updated_at"), "<=", now - RECONCILE_AFTER))
        .limit(limit)
    )
    views = versioned(db, "job view", _parsed_view)
    jobs = [job for job in (views.get(s)[1] for s in q.stream()) if job.attempt and job.tpu]
    if not jobs:
        return []
    # One batched read of their executions' records (one round trip, not one a job).
    refs = [db.collection(store.EXECUTIONS).document(execution_doc_id(job.id, job.attempt)) for job in jobs]
    records = {s.id: s.to_dict() for s in db.get_all(refs)}
    events = []
    for job, ref in zip(jobs, refs):
        end = ExecutionEnd.from_doc(records.get(ref.id))
        if end is None:
            continue
        events.append(AttemptEvent(
            kind=AttemptEventKind.ended, job_id=job.id, attempt=job.attempt,
            attempt_id=job.attempt_id or lifecycle.attempt_id_for(job.id, job.attempt), node=job.tpu,
            outcome=AttemptOutcome(end.outcome), detail=end.detail, at=now))
    return events


def follow_up_unstarted_assignments(ctx: Context, budgets: Callable[[], RetryBudgets]) -> int:
    """Backstop for an attempt the executor has not started: its Assignment is sent again (same attempt id: lost
    between commit and publish, or by a restarted executor), and once it was sent enough, long enough ago
    (`lifecycle.unstarted_assignment`), the attempt ends `infra_failed`, its job is retried on its infrastructure
    budget (`budgets()`: the fleet is read only when a job is found) and its TPU freed and quarantined. Returns how
    many attempts it ended."""
    db = ctx.clients.firestore
    now = ctx.now()
    # How long an assignment stays `assigned` before the tick sends it again (TPUQ_REPUBLISH_ASSIGNMENT_SECONDS,
    # 5 minutes). The executor starts an attempt once however often it is delivered (the worker's control lock),
    # so a shorter wait only costs pushes.
    after = ctx.settings.republish_assignment_after
    q = (
        db.collection(store.JOBS)
        .where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.assigned))
        .where(filter=FieldFilter(JobDoc.field("assigned_at"), "<=", now - after))
        .limit(100)
    )
    ended = 0
    for snap in q.stream():
        job = JobDoc.from_doc(snap.to_dict(), snap.id)
        if not job.attempt or not job.tpu:
            continue
        decision, stored, tpu = _follow_up(ctx, snap.reference, job, after, budgets(), now)
        if decision.end is not None:
            log.warning("job %s: %s; its TPU %s is freed and quarantined", job.id, decision.detail,
                        short_node_name(job.tpu))
            notices.Teller(ctx).attempt_ended(stored, decision.end.job, job.attempt)
            ended += 1
        elif decision.republish is not None:
            # A job whose cancel was asked gets its cancel again (that message may have been lost too), not its run.
            cancel = JobDoc.from_doc(stored, job.id).cancel_requested
            action = AssignmentAction.cancel if cancel else AssignmentAction.assign
            endpoints = (tpu or {}).get("endpoints") or []
            message = lifecycle.assignment_message(stored, endpoints, now, action)
            if len(job.gang) > 1:  # a multislice attempt: every slice's node and workers, again
                slices = [snap.to_dict() or {} for snap in db.get_all(
                    [db.collection(store.TPUS).document(short_node_name(n)) for n in job.gang])]
                by_name = {d.get("name"): d for d in slices}
                message = gangs.with_slices(message, [by_name.get(n) or {"name": n} for n in job.gang],
                                            gangs.slices_wanted(JobDoc.from_doc(stored, job.id)))
            ctx.publish("assignments", message)
    return ended


def next_follow_up(db, after: timedelta) -> datetime | None:
    """When the follow-up is next due: the oldest job still assigned's `assigned_at + after` (one read), or None
    with none assigned."""
    q = (db.collection(store.JOBS).where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.assigned))
         .order_by(JobDoc.field("assigned_at")).limit(1))
    for snap in q.stream():
        assigned_at = (snap.to_dict() or {}).get(JobDoc.field("assigned_at"))
        return assigned_at + after if isinstance(assigned_at, datetime) else None
    return None


def _follow_up(ctx: Context, job_ref, job: JobDoc, after: timedelta, budgets: RetryBudgets, now):
    """One job's follow-up, committed guarded on the job (and TPU) as read: a `started` event that reaches the job
    first keeps its attempt (the decision is made again on what it wrote), and one that comes after the end finds
    the job pending and changes nothing."""
    db = ctx.clients.firestore
    attempt_id = job.attempt_id or lifecycle.attempt_id_for(job.id, job.attempt)
    tpu_ref = db.collection(store.TPUS).document(short_node_name(job.tpu or ""))
    other_refs = [db.collection(store.TPUS).document(short_node_name(n)) for n in gangs.other_slices(job)]
    attempt_ref = job_ref.collection(store.ATTEMPTS).document(str(job.attempt))
    # The executor's record of the attempt, read and written under the same guard: an end commits only if the
    # executor has not begun the attempt meanwhile, and it records the attempt as ended there, so a copy of the
    # assignment delivered later is dropped by the executor (`executor.decide.to_start`) instead of run beside
    # the retry.
    execution_ref = db.collection(store.EXECUTIONS).document(execution_doc_id(job.id, job.attempt))

    def decide(job_snap, tpu_snap, execution_snap, *other_snaps):
        stored, tpu, execution = job_snap.to_dict(), tpu_snap.to_dict(), execution_snap.to_dict()
        if stored is None or JobDoc.from_doc(stored, job_snap.id).attempt != job.attempt:
            return WriteSet(), (lifecycle.UnstartedAssignment(), stored, tpu)
        decision = lifecycle.unstarted_assignment(stored, execution, now, after, budgets, ctx.rng)
        writes = WriteSet().update(job_snap, decision.republish)
        if decision.end is not None:
            # Quarantined, not only freed: whatever the executor did on it is not to be trusted.
            suspect = lifecycle.suspect_reason(attempt_id, AttemptOutcome.infra_failed)
            writes.update(job_snap, decision.end.job).merge(attempt_ref, decision.end.attempt)
            writes.update(tpu_snap, lifecycle.tpu_freed(tpu, attempt_id, now, suspect))
            for other in other_snaps:  # a multislice attempt: every slice of it
                writes.update(other, lifecycle.tpu_freed(other.to_dict(), attempt_id, now, suspect))
            writes.update(execution_snap, lifecycle.abandoned_record(stored, decision.detail, now))
        return writes, (decision, stored, tpu)

    return read_decide_commit(db, [job_ref, tpu_ref, execution_ref, *other_refs], decide)
