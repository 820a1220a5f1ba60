"""The executor service: shell (SSH, GCS, Firestore, Pub/Sub). Assignments in, attempt events out.

Each handler reads the attempt's record, asks `decide` (pure) and `outcome`
(pure) what to do, and applies it.

- `/push/assignments`: assign → prepare every worker and launch (idempotent per
  attempt); publish `started`, or `ended` when it could not start. cancel → TERM
  then KILL on every worker; publish `ended cancelled`.
- `/push/gcs-status`: a worker's status object was finalized → judge the attempt;
  publish `ended` once it is decided. This is how the end of a job is noticed:
  by event, not by polling.
- `/push/ticks`: the backstop. Re-judges started attempts whose decision was
  deferred (a grace for the other workers) or whose status events were lost.

Each attempt has one document `executions/{job}:{attempt}` holding the
assignment and whether its end was published, so a restarted executor (or a
second instance) picks up where the first left off, and an outcome is published
once. What one instance keeps besides (its Executor and SSH connections, the
probe interval and when it last probed each running attempt: a probe writes the
record only when a worker turns unreachable or answers again) is `build_service`'s `ExecutorState` (tpuq.executor.state),
read from `ctx.state`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta

from tpuq.contracts import gcslayout, store
from tpuq.contracts.documents import TPU_STATES_IN_SERVICE, ExecutionDoc, execution_doc_id, short_node_name
from tpuq.contracts.errors import Permanent
from tpuq.contracts.messages import Assignment, AssignmentAction, GcsObjectEvent, Tick
from tpuq.executor import budget, decide, tickstate
from tpuq.runtime import tickdue
from tpuq.executor.decide import AssignmentStep
from tpuq.executor.executor import Executor
from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.state import ExecutorState, build_executor
from tpuq.runtime.clients import Clients
from tpuq.runtime.guarded import WriteSet, commit_if_unchanged, read_decide_commit
from tpuq.runtime.concurrency import map_concurrently
from tpuq.runtime.isolation import Isolated
from tpuq.runtime.service import Context, Service
from tpuq.runtime.settings import Settings

log = logging.getLogger("tpuq.executor")
EXECUTIONS = store.EXECUTIONS
TICK_BATCH = 50
# Running attempts probed at once by a tick. A probe waits on SSH: a dead host for its whole connect timeout
# (10 s). One after another, six dead hosts held the tick past its subscription's 60 s ack deadline, and Pub/Sub
# delivered it again beside the first; at 16 at a time a full batch of dead hosts takes 4 rounds (about 40 s).
PROBES_AT_ONCE = 16


def _state(ctx: Context) -> ExecutorState:
    return ctx.state


def _execution_ref(db, job_id: str, attempt: int):
    return db.collection(EXECUTIONS).document(execution_doc_id(job_id, attempt))


def _publish_end(ctx: Context, assignment: Assignment, decided: Decided) -> None:
    """Publish the attempt's end once: the execution document remembers that it was published."""
    ref = _execution_ref(ctx.clients.firestore, assignment.job_id, assignment.attempt)
    ended = decide.end(ref.get().to_dict(), assignment, decided, ctx.now())
    if ended is None:
        return
    ctx.publish("attempt-events", ended.event)
    ref.set(ended.record, merge=True)
    log.info("attempt %s ended: %s", assignment.attempt_id, decided.outcome.value)


def on_assignment(assignment: Assignment, ctx: Context) -> None:
    db = ctx.clients.firestore
    ref = _execution_ref(db, assignment.job_id, assignment.attempt)
    executor = _state(ctx).executor
    if assignment.action is AssignmentAction.cancel:
        stored = ref.get().to_dict() or {}
        original = Assignment.model_validate(stored["assignment"]) if stored.get("assignment") else assignment
        _publish_end(ctx, original, executor.cancel_attempt(original, reason="cancelled by user"))
        return
    lease_by = uuid.uuid4().hex  # this delivery, in the record's start lease
    step, stored = _record_starting(db, ref, assignment, ctx.now(), lease_by)
    if step is AssignmentStep.underway:
        step, stored = _wait_while_underway(db, ref, assignment, ctx, lease_by)
    if step is AssignmentStep.underway:
        log.info("attempt %s: another delivery of its assignment is starting it and renews its lease (until %s): "
                 "this copy starts nothing", assignment.attempt_id, stored.get(ExecutionDoc.field("start_lease_until")))
        return
    if step is AssignmentStep.republish:
        # Started: the executor may have died between recording it and publishing `started` (this copy is
        # then the redelivery of an unacknowledged push). Published again; the scheduler ignores a repeat.
        ctx.publish("attempt-events", decide.started_event(assignment, ctx.now()))
        return
    if step is AssignmentStep.over:  # a redelivery (or a late copy) of an attempt that is over
        return
    try:
        with _LeaseRenewal(db, ref, lease_by, ctx.now, _state(ctx).lease_renew_seconds):
            result = executor.start_attempt(assignment)
    except Permanent as e:
        if not _started_meanwhile(ref):
            _publish_end(ctx, assignment, decide.cannot_start(e))
        return
    except Exception:
        _release_start(db, ref, lease_by)  # Pub/Sub delivers the push again: that delivery starts it
        raise
    if result.outcome is not None:
        if not _started_meanwhile(ref):
            _publish_end(ctx, assignment, decide.start_failure(result.outcome, _nodes(db, assignment)[0]))
        return
    ref.set(decide.started_record(ctx.now()), merge=True)
    # Also when the workers already ran it (`result.already`): the delivery that launched it may have died
    # before publishing. The scheduler ignores a repeat.
    ctx.publish("attempt-events", decide.started_event(assignment, ctx.now()))


def _started_meanwhile(ref) -> bool:
    """Another delivery of the assignment started the attempt while this one tried (both read `starting`): this
    one's failure (an SSH connect that failed a moment) is not the end of an attempt whose command runs."""
    return (ref.get().to_dict() or {}).get("state") == decide.STARTED


def _record_starting(db, ref, assignment: Assignment, now: datetime,
                     lease_by: str) -> tuple[AssignmentStep, dict | None]:
    """What this delivery does (`decide.decide_assignment`) and the record it read. To start: the attempt's record
    written as `starting`, with this delivery's lease on it. Otherwise the record is left unchanged. Guarded: a
    copy that read `starting` while another delivery wrote `started` (or took the lease) reads again instead of
    writing over it."""
    until = now + timedelta(seconds=budget.start_lease_seconds())

    def decide_start(snap):
        stored = snap.to_dict()
        step = decide.decide_assignment(stored, now)
        if step is not AssignmentStep.start:
            return WriteSet(), (step, stored)
        record = decide.start_record(assignment, now) | decide.start_lease(until, lease_by)
        return WriteSet().update(snap, record), (step, stored)

    return read_decide_commit(db, [ref], decide_start)


def _wait_while_underway(db, ref, assignment: Assignment, ctx: Context,
                         lease_by: str) -> tuple[AssignmentStep, dict | None]:
    """A copy that found another delivery starting the attempt waits for that start to end, or for its lease to run
    out (the delivery died: its instance was killed mid-start), and then does what the record says: nothing, publish
    `started` again, or start the attempt itself. Gives up after `underway_wait_seconds` (the holder is alive and
    renewing its lease: it publishes the end)."""
    state = _state(ctx)
    waited, step, stored = 0.0, AssignmentStep.underway, None
    while waited < state.underway_wait_seconds:
        state.sleep(budget.UNDERWAY_POLL_SECONDS)
        waited += budget.UNDERWAY_POLL_SECONDS
        step, stored = _record_starting(db, ref, assignment, ctx.now(), lease_by)
        if step is not AssignmentStep.underway:
            break
    return step, stored


class _LeaseRenewal:
    """Renews this delivery's start lease every `every` seconds while the start runs, from a thread of its own (the
    start blocks in SSH). Stops when the start ends, or when the lease is no longer this delivery's."""

    def __init__(self, db, ref, lease_by: str, now, every: float):
        self._db, self._ref, self._lease_by, self._now, self._every = db, ref, lease_by, now, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="start-lease", daemon=True)

    def __enter__(self) -> "_LeaseRenewal":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            until = self._now() + timedelta(seconds=budget.start_lease_seconds())

            def decide_renewal(snap):
                fields = decide.lease_renewed(snap.to_dict(), self._lease_by, until)
                return WriteSet().update(snap, fields), fields is not None

            try:
                if not read_decide_commit(self._db, [self._ref], decide_renewal):
                    return
            except Exception as e:  # noqa: BLE001 - try again at the next renewal; the lease outlasts three misses
                log.warning("could not renew the start lease on %s: %s", self._ref.id, e)


def _release_start(db, ref, lease_by: str) -> None:
    """End this delivery's lease on the attempt (its start raised). Best effort: a lease left behind ends by itself,
    and the scheduler sends the assignment again."""

    def decide_release(snap):
        return WriteSet().update(snap, decide.lease_released(snap.to_dict(), lease_by)), None

    try:
        read_decide_commit(db, [ref], decide_release)
    except Exception as e:  # noqa: BLE001 - the start's own error is the one raised
        log.warning("could not release the start lease on %s: %s", ref.id, e)


def _tpu_doc(db, node: str) -> dict | None:
    return db.collection(store.TPUS).document(short_node_name(node)).get().to_dict()


def _nodes(db, assignment: Assignment) -> tuple[NodeState, str | None]:
    """The state and problem of the attempt's node, or of all its slices' (a multislice attempt)."""
    nodes = [one.node for one in assignment.slices] or [assignment.node]
    return decide.slices_state([_tpu_doc(db, node) for node in nodes], nodes)


def _node_problem(ctx: Context, stored: dict) -> str | None:
    """Why the attempt's node (any of its slices) must not go on running it, from tpus/{node}.node_health."""
    return _nodes(ctx.clients.firestore, Assignment.model_validate(stored["assignment"]))[1]


def _judge(ctx: Context, stored: dict, probed: decide.Probed = decide.Probed(),
           record_deferral: bool = True) -> datetime | None:
    """Decide the attempt's outcome and publish its end; or, deferred to a time (`Wait.until`), that time
    (recorded for the ticks, `tickstate`, unless the caller records it)."""
    assignment = Assignment.model_validate(stored["assignment"])
    executor = _state(ctx).executor
    state, problem = _nodes(ctx.clients.firestore, assignment)
    problem = problem or probed.problem
    decision = executor.read_outcome(assignment, state, probed.lost, probed.unwritable, node_problem=problem)
    if not isinstance(decision, Decided):
        until = getattr(decision, "until", None)
        if record_deferral:
            tickstate.lower_judge_at(ctx.clients.firestore, until, _tick_due(ctx), ctx.now())
        return until
    _publish_end(ctx, assignment, decision)
    if decide.stop_after_end(decision, problem):
        # No cancel marker: the attempt did not end cancelled. Best effort: the janitor deletes the quarantined
        # TPU in any case.
        try:
            executor.cancel_attempt(assignment, reason=decide.stop_reason(decision, problem), marker=False)
        except Exception as e:  # noqa: BLE001 - the end is published; the node is deleted anyway
            log.warning("attempt %s: could not stop its workers on the quarantined node: %s", assignment.attempt_id, e)
    return None


def _probe(ctx: Context, snap, stored: dict) -> decide.Probed:
    """Ask the workers, at most once per probe interval per attempt (`Settings.executor_probe_every`, the last
    probe kept in this instance's memory), whether the attempt still runs there: a supervisor killed with its
    host (or by the OOM killer) leaves no status object to wake us, and one whose status object GCS refused
    leaves only its local copy, which says why. Called only when one is due (`_probe_due`)."""
    now, state = ctx.now(), _state(ctx)
    every = state.probe_every
    assignment = Assignment.model_validate(stored["assignment"])
    answers = decide.probed(state.executor.probe_attempt(assignment))
    state.record_probe(snap.id, now)
    since = decide.unreachable_since(stored, answers, now)
    record = decide.probe_record(stored, since, now)
    if record is not None:  # a worker turned unreachable, or answered again: the grace starts or ends
        snap.reference.set(record, merge=True)
    return decide.unreachable_problem(answers, since, now, decide.unreachable_grace(every))


def _probe_due(ctx: Context, attempt_doc_id: str, stored: dict) -> bool:
    state = _state(ctx)
    return state.probe_every is not None and decide.probe_due(stored, ctx.now(), state.probe_every,
                                                              state.probed_at(attempt_doc_id))


def _probe_caught(ctx: Context, snap, stored: dict) -> tuple[decide.Probed | None, Exception | None]:
    """`_probe`, its failure returned rather than raised: raised in the tick's loop, in that attempt's part."""
    try:
        return _probe(ctx, snap, stored), None
    except Exception as e:  # noqa: BLE001 - isolated per attempt by the caller
        return None, e


def on_status_object(event: GcsObjectEvent, ctx: Context) -> None:
    ref_name = gcslayout.parse_status_object_name(event.name)
    if ref_name is None:
        return  # not a status object: bundles, logs, submitted job files
    stored = _execution_ref(ctx.clients.firestore, ref_name.job_id, ref_name.attempt).get().to_dict()
    if decide.judgeable(stored):
        _judge(ctx, stored)


def on_tick(tick: Tick, ctx: Context) -> None:
    """Judge again what no event brings, when due (`tickstate`): one read when nothing is."""
    db = ctx.clients.firestore
    snap = tickstate.state_ref(db).get()
    stored = snap.to_dict() or {}
    now = ctx.now()
    due = _tick_due(ctx)
    sweep = tickstate.sweep_due(stored, now, ctx.settings.backstop_every)
    if sweep and not commit_if_unchanged(db, WriteSet().update(snap, due.fields(stored, {tickstate.SWEEP_AT: now},
                                                                                 now))):
        sweep = False  # another instance claimed it meanwhile: it judges them
    elif not sweep and stored.get(tickdue.DUE_AT) != due.at(stored, now):
        # Probing turned on or off since the document was written: its `due_at` says so now (routed ticks).
        commit_if_unchanged(db, WriteSet().update(snap, due.fields(stored, {}, now)))
    judge_all = sweep or tickstate.judge_due(stored, now)
    probing = due.probing
    if judge_all or probing:
        _tick_attempts(ctx, judge_all, stored, now)
    _forget_departed_nodes_isolated(ctx)


def _tick_attempts(ctx: Context, judge_all: bool, state: dict, now: datetime | None) -> None:
    """Probe each running attempt when due; judge every one (`judge_all`), or only those a probe found something
    on. `state`: `tick_due/executor` as read at `now`."""
    from google.cloud import firestore

    # Only started attempts: one stuck in `starting` must not take a place in the batch for ever.
    query = (ctx.clients.firestore.collection(EXECUTIONS)
             .where(filter=firestore.FieldFilter("ended", "==", False))
             .where(filter=firestore.FieldFilter("state", "==", decide.STARTED)).limit(TICK_BATCH))
    # Each attempt isolated: one that cannot be judged never stops the others. Not raised: the next tick
    # is the retry, and redelivering this one would probe the others' workers again.
    attempts = Isolated("executor tick", log)
    running: set[str] = set()
    deferred: list[datetime] = []
    judgeable: list[tuple] = []
    for snap in query.stream():
        running.add(snap.id)
        stored = snap.to_dict() or {}
        if decide.judgeable(stored):
            judgeable.append((snap, stored))
    # The probes together (each waits on its workers' SSH), then the judgements one by one, as before.
    # Threads only for the probes due: a tick between probes starts none.
    due = [(snap, stored) for snap, stored in judgeable if _probe_due(ctx, snap.id, stored)]
    probes = dict(zip((snap.id for snap, _ in due), map_concurrently(lambda item: _probe_caught(ctx, *item), due,
                                                                     PROBES_AT_ONCE)))
    for snap, stored in judgeable:
        probed, failure = probes.get(snap.id, (None, None))
        with attempts.part(f"judging {snap.id}"):
            if failure is not None:
                raise failure
            # Between sweeps, only what a probe found: on the workers, or in the node's recorded health (a node
            # turned unhealthy brings the executor no event; read at the probe's cadence, not the backstop's).
            if judge_all or probed is not None and (probed != decide.Probed() or _node_problem(ctx, stored)):
                probed = probed or decide.Probed()
                until = _judge(ctx, stored, probed, record_deferral=False)
                if until is not None:
                    deferred.append(until)
    _state(ctx).keep_probes_of(running)
    if judge_all:
        tickstate.replace_judge_at(ctx.clients.firestore, state, min(deferred, default=None), now, _tick_due(ctx))


def _tick_due(ctx: Context) -> tickstate.TickDue:
    return tickstate.TickDue(ctx.settings.backstop_every, probing=_state(ctx).probe_every is not None)


def _forget_departed_nodes_isolated(ctx: Context) -> None:
    parts = Isolated("executor tick", log)
    with parts.part("closing connections to nodes that left"):
        _forget_departed_nodes(ctx)


def _forget_departed_nodes(ctx: Context) -> None:
    """Close the SSH connections kept to nodes whose TPU is gone (or was never stored): one read per node kept."""
    executor = _state(ctx).built
    if executor is None or executor.connection_cache is None:
        return  # nothing was ever connected by this instance
    kept = executor.connection_cache.nodes()
    if not kept:
        return
    db = ctx.clients.firestore
    refs = [db.collection(store.TPUS).document(short) for short in {short_node_name(node) for node in kept}]
    in_service = {snap.id for snap in db.get_all(refs)
                  if snap.exists and (snap.to_dict() or {}).get("state") in TPU_STATES_IN_SERVICE}
    closed = executor.forget_nodes(decide.departed_nodes(set(kept), in_service))
    if closed:
        log.info("closed %d SSH connections to nodes that left", closed)


ROUTES = {
    "/push/assignments": on_assignment,
    "/push/gcs-status": on_status_object,
    "/push/ticks": on_tick,
}


def build_service(settings: Settings, clients: Clients | None = None, *, executor: Executor | None = None,
                  probe: bool = True) -> Service:
    """The executor, serving with `executor` (a shell with the Executor's methods: tests', the fleet simulator's)
    or else the real Executor, built on first use from `settings` and `clients`. `probe=False`: the workers are
    never probed (the simulator's modelled workers are never lost without their node); otherwise every
    `settings.executor_probe_every`."""
    clients = clients if clients is not None else Clients(settings)
    probe_every = settings.executor_probe_every if probe else None
    state = (ExecutorState.of(executor, probe_every) if executor is not None
             else ExecutorState(lambda: build_executor(settings, clients), probe_every))
    return Service(name="executor", routes=ROUTES, settings=settings, clients=clients, state=state)
