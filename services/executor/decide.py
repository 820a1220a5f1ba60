"""The executor's decisions around an attempt: core (pure, no I/O).

`handlers.py` (the shell) reads `executions/{job}:{attempt}` and the node's
`tpus/{node}` document, asks these functions what to do, and applies the answer
over SSH, GCS, Firestore and Pub/Sub. How the workers' statuses add up to an
outcome is `outcome.decide_outcome`; this module decides the rest: whether an
attempt is still ours to start or judge, what its end says, and when its
workers are asked again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Mapping

from tpuq.contracts.documents import (ExecutionDoc, ExecutionEnd, ExecutionState, NodeHealth, TpuDoc, TpuState,
                                      short_node_name)
from tpuq.contracts.documents.tpus import lost_by_preemption
from tpuq.executor.outcome import EXECUTOR_STOP_PREFIX, Decided, NodeState
from tpuq.contracts.messages import Assignment, AttemptEvent, AttemptEventKind, AttemptOutcome

Doc = dict[str, Any]
DETAIL_EVENT_LIMIT = 8000  # AttemptEvent.detail max_length
DETAIL_RECORD_LIMIT = 2000

# executions/{job}:{attempt}.state
STARTING, STARTED = ExecutionState.starting, ExecutionState.started
# A worker SSH cannot reach at every probe for this long (UNREACHABLE_PROBES probe intervals, at least
# UNREACHABLE_MIN), on a node the API calls READY, ends its attempt.
UNREACHABLE_PROBES = 3
UNREACHABLE_MIN = timedelta(seconds=60)


def is_over(execution: Doc | None) -> bool:
    """The attempt's end was published: a redelivery starts, judges or publishes nothing."""
    return bool(execution and execution.get("ended"))


def to_start(execution: Doc | None) -> bool:
    """Whether a delivery of the attempt's assignment starts it: only while its record is absent or `starting`.
    Once `started`, the command runs and the tick's judge and probe own the attempt: a copy delivered late must
    neither write `starting` back over it (the tick judges only `started` attempts, so one whose copy then died
    would be judged by nothing) nor start it again on its workers."""
    return not is_over(execution) and (execution or {}).get("state") != STARTED


def start_underway(execution: Doc | None, now: datetime) -> bool:
    """Another delivery of the assignment is starting the attempt right now: its record is `starting` and that
    delivery's lease runs (`start_lease_until`: its start's time budget and cleanup, tpuq.executor.budget). A copy
    then starts nothing, so no second `prepare` runs beside the first: the delivery holding the lease renews it
    while it runs and publishes `started` or `ended`. Had it died, its lease runs out within a minute, and the
    copy waiting for it (or a later one: Pub/Sub's redelivery, the scheduler's tick every 5 minutes,
    `Settings.republish_assignment_after`) starts the attempt."""
    if not execution or execution.get("state") != STARTING or is_over(execution):
        return False
    until = execution.get(ExecutionDoc.field("start_lease_until"))
    return isinstance(until, datetime) and now < until


class AssignmentStep(Enum):
    """What a delivery of an attempt's assignment does, from the attempt's record (`decide_assignment`)."""

    start = "start"          # record `starting` with this delivery's lease, then start it on the workers
    underway = "underway"    # another delivery's lease runs: this copy starts nothing
    republish = "republish"  # it started: publish `started` again (the delivery that started it may have died
    #                          before publishing; the scheduler ignores a repeat)
    over = "over"            # its end was published: nothing


def decide_assignment(execution: Doc | None, now: datetime) -> AssignmentStep:
    """What this delivery of the attempt's assignment does, given the attempt's record as read now."""
    if not to_start(execution):
        return AssignmentStep.over if is_over(execution) else AssignmentStep.republish
    if start_underway(execution, now):
        return AssignmentStep.underway
    return AssignmentStep.start


def lease_released(execution: Doc | None, lease_by: str) -> Doc | None:
    """The fields that end this delivery's lease, when its start raised (Pub/Sub delivers the push again within
    seconds, and that delivery must not find the attempt leased); None when the lease is another's or over."""
    if not execution or execution.get("state") != STARTING or \
            execution.get(ExecutionDoc.field("start_lease_by")) != lease_by:
        return None
    return ExecutionDoc.fields(start_lease_until=None)


def lease_renewed(execution: Doc | None, lease_by: str, until: datetime) -> Doc | None:
    """The fields that renew this delivery's lease while its start runs (tpuq.executor.budget); None when the lease
    is no longer this delivery's to renew: released, taken over by a copy after it ran out, or the attempt started
    or ended."""
    if not execution or execution.get("state") != STARTING or is_over(execution) or \
            execution.get(ExecutionDoc.field("start_lease_by")) != lease_by:
        return None
    return ExecutionDoc.fields(start_lease_until=until)


def judgeable(execution: Doc | None) -> bool:
    """An attempt this executor started and whose end is not yet published."""
    return bool(execution) and not is_over(execution) and bool(execution.get("assignment"))


def start_record(assignment: Assignment, now: datetime) -> Doc:
    return ExecutionDoc.fields(job_id=assignment.job_id, attempt=assignment.attempt, attempt_id=assignment.attempt_id,
                               node=assignment.node, assignment=assignment.model_dump(mode="json"), state=STARTING,
                               ended=False, received_at=now)


def start_lease(until: datetime, lease_by: str) -> Doc:
    """Merged into the start record by the delivery that starts the attempt: the lease it holds while it does
    (`lease_by` names the delivery; see start_underway)."""
    return ExecutionDoc.fields(start_lease_until=until, start_lease_by=lease_by)


def started_record(now: datetime) -> Doc:
    return ExecutionDoc.fields(state=STARTED, started_at=now)


def cannot_start(reason: object) -> Decided:
    """It can never run (no endpoints, no bucket, env overriding runner variables): end it as a setup failure,
    so the job does not sit in `assigned` for ever and the TPU is not held."""
    return Decided(AttemptOutcome.failed_setup, f"cannot start: {reason}")


def node_state(tpu: Doc | None) -> NodeState:
    """What the scheduler's record of the node says: preempted once its queued resource was seen SUSPENDED (its
    `gone_reason`), gone when it was lost otherwise (NOT_FOUND, FAILED, deleted): both end the attempt preempted,
    and the detail says which (`node preempted`, `node gone`), never more than the record proves."""
    if tpu is None:
        return NodeState.unknown
    if tpu.get("state") != TpuState.gone:
        return NodeState.ready
    return NodeState.preempted if lost_by_preemption(tpu.get(TpuDoc.field("gone_reason"))) else NodeState.gone


def node_problem(tpu: Doc | None) -> str | None:
    """Why the node must not go on running the attempt, from its recorded health (tpus/{node}.node_health), or
    None. Maintenance that is only scheduled is no reason: the attempt runs until the node is really unhealthy."""
    health = NodeHealth.from_doc(tpu)
    return health.unhealthy() if health is not None else None


def slices_state(tpus: list[Doc | None], nodes: list[str]) -> tuple[NodeState, str | None]:
    """`node_state` and `node_problem` of an attempt on these nodes (a multislice attempt's slices, in slice order;
    one node otherwise). A preemption, a loss or a problem on any slice is the attempt's: the slices run one job,
    and Multislice cannot go on without one of them."""
    if len(tpus) == 1:
        return node_state(tpus[0]), node_problem(tpus[0])
    states = {node_state(t) for t in tpus}
    state = next((s for s in (NodeState.preempted, NodeState.gone, NodeState.unknown) if s in states), NodeState.ready)
    problems = [f"slice {i} ({short_node_name(n)}): {p}" for i, (t, n) in enumerate(zip(tpus, nodes))
                if (p := node_problem(t)) is not None]
    return state, problems[0] if problems else None


def start_failure(decided: Decided, node: NodeState) -> Decided:
    """Unreachable because the node was preempted (or deleted) meanwhile: that is a preemption, with its own
    budget."""
    if decided.outcome is AttemptOutcome.infra_failed and node in (NodeState.preempted, NodeState.gone):
        return Decided(AttemptOutcome.preempted, f"node {node.value}: {decided.detail}", decided.exit_codes)
    return decided


def probe_due(execution: Doc, now: datetime, every: timedelta, probed_here: datetime | None = None) -> bool:
    """Ask a started attempt's workers at most once per `every`, and not in its first `every`. The last probe is
    the later of this instance's (`probed_here`, kept in its memory: `ExecutorState.probed_at`) and the one
    recorded (`probed_at`, written only when a probe changed what the record says: see `probe_record`). An
    instance that restarted, or a second one, probes once more than needed at worst: a probe only reads."""
    started_at, probed_at = execution.get("started_at"), execution.get(ExecutionDoc.field("probed_at"))
    if started_at is None or now - started_at < every:
        return False
    last = max((t for t in (probed_at, probed_here) if isinstance(t, datetime)), default=None)
    return not (last and now - last < every)


def probe_record(execution: Doc, since: datetime | None, now: datetime) -> Doc | None:
    """The fields a probe writes into the attempt's record, or None when it changed nothing the record says.
    What later probes (and other instances) need from it is only since when a worker has been unreachable
    (`unreachable_since`, the start of the grace): it is written when it starts or ends, with the probe's time;
    a probe that finds every worker as before writes nothing (the probe-due time is kept in memory)."""
    if execution.get(ExecutionDoc.field("unreachable_since")) == since:
        return None
    return ExecutionDoc.fields(probed_at=now, unreachable_since=since)


@dataclass(frozen=True)
class Probed:
    lost: frozenset[int] = frozenset()  # workers whose supervisor is gone without a status object
    unwritable: Mapping[int, str] = field(default_factory=dict)  # worker -> why its status is not in GCS
    unreachable: frozenset[int] = frozenset()  # workers SSH could not reach at this probe
    problem: str | None = None  # set by `unreachable_problem`: the attempt ends as an infrastructure failure


def probed(probes: Mapping[int, Any]) -> Probed:
    """The workers' answers (`ssh.Probe`-like: `.lost`, `.status_error`, `.reachable`) as what the outcome needs."""
    return Probed(frozenset(w for w, p in probes.items() if p.lost),
                  {w: p.status_error for w, p in probes.items() if p.status_error},
                  frozenset(w for w, p in probes.items() if not getattr(p, "reachable", True)))


def unreachable_since(execution: Doc, probed_now: Probed, now: datetime) -> datetime | None:
    """Since when some worker has been unreachable at every probe (None: every worker answered)."""
    if not probed_now.unreachable:
        return None
    return execution.get(ExecutionDoc.field("unreachable_since")) or now


def unreachable_grace(probe_every: timedelta) -> timedelta:
    """How long a worker may stay unreachable at every probe before its attempt ends."""
    return max(UNREACHABLE_PROBES * probe_every, UNREACHABLE_MIN)


def unreachable_problem(probed_now: Probed, since: datetime | None, now: datetime, grace: timedelta) -> Probed:
    """A worker unreachable at every probe for `grace`, on a node the API still calls READY: its host is down
    (a VM that crashed, or lost its network) and its supervisor can write no status. Without this the attempt
    would wait for ever; it ends as an infrastructure failure, retried from that budget."""
    if since is None or now - since < grace:
        return probed_now
    workers = ", ".join(str(w) for w in sorted(probed_now.unreachable))
    seconds = int((now - since).total_seconds())
    return Probed(probed_now.lost, probed_now.unwritable, probed_now.unreachable,
                  f"worker {workers} unreachable over SSH for {seconds} s (its host is down)")


def stop_after_end(decided: Decided, problem: str | None) -> bool:
    """Whether the workers are stopped once the end is published: the attempt ended an infrastructure failure
    because its node turned unhealthy while it ran, or a worker's last lines showed a known TPU runtime failure;
    or it failed while workers still ran past the failure grace (both `Decided.stop_workers`). The job is retried
    elsewhere, or the slice goes to the next job: what may still run there is stopped, or two attempts would run at
    once."""
    return decided.stop_workers or (bool(problem) and decided.outcome is AttemptOutcome.infra_failed)


def stop_reason(decided: Decided, problem: str | None) -> str:
    """The cancel reason the stopped workers record."""
    reason = f"node unhealthy: {problem}" if problem else decided.detail.splitlines()[0]
    return EXECUTOR_STOP_PREFIX + reason


def departed_nodes(kept: set[str], in_service: set[str]) -> set[str]:
    """The nodes this instance keeps SSH connections to whose TPU is no longer in service (`in_service`: the short
    names of the `tpus/` documents whose state is in service)."""
    return {node for node in kept if short_node_name(node) not in in_service}


@dataclass(frozen=True)
class End:
    event: AttemptEvent
    record: Doc  # merged into executions/{job}:{attempt}


def end(execution: Doc | None, assignment: Assignment, decided: Decided, now: datetime) -> End | None:
    """The attempt's `ended` event and the record that it was published; None when it already was."""
    if is_over(execution):
        return None
    detail = decided.detail or ""
    event = AttemptEvent(
        kind=AttemptEventKind.ended, job_id=assignment.job_id, attempt=assignment.attempt,
        attempt_id=assignment.attempt_id, node=assignment.node, outcome=decided.outcome,
        detail=detail[:DETAIL_EVENT_LIMIT], exit_codes=decided.exit_codes, at=now)
    record = ExecutionEnd(decided.outcome.value, detail[:DETAIL_RECORD_LIMIT], now).to_doc()
    return End(event, record)


def started_event(assignment: Assignment, now: datetime) -> AttemptEvent:
    return AttemptEvent(kind=AttemptEventKind.started, job_id=assignment.job_id, attempt=assignment.attempt,
                        attempt_id=assignment.attempt_id, node=assignment.node, at=now)
