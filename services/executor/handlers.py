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
once.
"""

from __future__ import annotations

import logging
import os
import uuid
from datetime import datetime, timedelta
from functools import cached_property

import paramiko

from tpuq.contracts import gcslayout, store
from tpuq.contracts.documents import TPU_STATES_IN_SERVICE, ExecutionDoc, TpuDoc, execution_doc_id, short_node_name
from tpuq.contracts.errors import Permanent
from tpuq.executor import budget, decide
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.pins import GuestAttributeHostKeys
from tpuq.executor.ssh import ConnectionCache, SshLogin
from tpuq.runtime.fleetstore import load_fleet
from tpuq.runtime.guarded import WriteSet, read_decide_commit
from tpuq.executor.workerspec import WorkerSettings
from tpuq.runtime.isolation import Isolated
from tpuq.contracts.messages import Assignment, AssignmentAction, AttemptOutcome, GcsObjectEvent, Tick
from tpuq.runtime.service import Context, Service

log = logging.getLogger("tpuq.executor")
EXECUTIONS = store.EXECUTIONS
TICK_BATCH = 50
# How often a running attempt's workers are asked whether it still runs (SSH to every worker).
# A worker SSH cannot reach at every probe for this long, on a node the API calls READY, ends its attempt.
UNREACHABLE_PROBES = 3
UNREACHABLE_MIN = timedelta(seconds=60)
PROBE_EVERY = timedelta(seconds=float(os.environ.get("TPUQ_EXECUTOR_PROBE_SECONDS", "60")))


class FirestorePinStore:
    """Host-key pins in `tpus/{node}.host_keys`, first writer wins (a transaction per node)."""

    def __init__(self, db):
        self.db = db

    def _ref(self, node: str):
        return self.db.collection(store.TPUS).document(short_node_name(node))

    def get_pins(self, node: str):
        snap = self._ref(node).get()
        if not snap.exists:
            return {}
        return {int(k): v for k, v in ((snap.to_dict() or {}).get(TpuDoc.field("host_keys")) or {}).items()}

    def add_pins(self, node: str, pins):
        from google.cloud import firestore

        ref = self._ref(node)

        @firestore.transactional
        def merge(tx):
            snap = ref.get(transaction=tx)
            current = {int(k): v for k, v in ((snap.to_dict() or {}).get(TpuDoc.field("host_keys")) or {}).items()}
            for worker, key in pins.items():
                current.setdefault(int(worker), key)
            tx.set(ref, TpuDoc.fields(host_keys={str(k): v for k, v in current.items()}), merge=True)
            return current

        return merge(self.db.transaction())

    def forget(self, node: str) -> None:
        from google.cloud import firestore

        self._ref(node).set(TpuDoc.fields(host_keys=firestore.DELETE_FIELD), merge=True)


def _load_private_key() -> paramiko.PKey:
    """The executor's SSH key: a file locally (tpuq dev up makes one); in production mounted from Secret Manager."""
    path = os.environ.get("TPUQ_SSH_PRIVATE_KEY_FILE")
    if not path:
        raise RuntimeError("TPUQ_SSH_PRIVATE_KEY_FILE is not set (mount the Secret Manager secret as a file)")
    return paramiko.Ed25519Key.from_private_key_file(path)


class ExecutorRuntime:
    """The Executor, built once per process on first use."""

    def __init__(self, clients):
        self.clients = clients
        self.probe_every: timedelta | None = PROBE_EVERY  # None: never probe (the simulator's workers)

    @cached_property
    def executor(self) -> Executor:
        from datetime import timezone

        emulator = self.clients.settings.storage_emulator
        runner = self.clients.settings.runner_bucket
        status_bucket = gcslayout.bucket_name(runner) if runner else None
        settings = (WorkerSettings.for_emulator(emulator, status_bucket=status_bucket) if emulator
                    else WorkerSettings(status_bucket=status_bucket))
        key = _load_private_key()
        return Executor(
            # One source for the login user: the fleet in force, whose ssh_user the claimer wrote into each node's
            # ssh-keys metadata (the only user the guest agent creates). Read per pool, as the transport.
            ssh_login=lambda: SshLogin.of(load_fleet(self.clients.firestore)),
            ssh_key=lambda: key,
            pin_store=FirestorePinStore(self.clients.firestore),
            # Host keys come from the nodes' guest attributes (roles/tpu.viewer), never from a first connection.
            host_keys=GuestAttributeHostKeys(self.clients.tpu),
            objects=GcsObjectStore(self.clients.storage),
            clock=lambda: datetime.now(timezone.utc),
            settings=settings,
            connection_cache=ConnectionCache() if keep_connections() else None,
        )


def keep_connections() -> bool:
    """TPUQ_EXECUTOR_KEEP_SSH=0 opens a new SSH connection per call (the default keeps them between attempts).
    Kept connections pay off only while the instance lives and its CPU runs between requests: on Cloud Run,
    min instances >= 1 and CPU always allocated (see docs/DEPLOYING.md, "Keeping the executor's SSH connections
    between jobs")."""
    return os.environ.get("TPUQ_EXECUTOR_KEEP_SSH", "1") != "0"


_RUNTIMES: dict[int, ExecutorRuntime] = {}


def runtime(ctx: Context) -> ExecutorRuntime:
    return runtime_for(ctx.clients)


def use_executor(clients, executor, probe_every: timedelta | None = PROBE_EVERY) -> None:
    """Serve these clients' messages with this executor shell instead of one built from the environment (the
    fleet simulator's modelled workers, which are never lost without their node: it never probes them)."""
    rt = runtime_for(clients)
    rt.__dict__["executor"] = executor
    rt.probe_every = probe_every


def runtime_for(clients) -> ExecutorRuntime:
    rt = _RUNTIMES.get(id(clients))
    if rt is None:
        rt = _RUNTIMES[id(clients)] = ExecutorRuntime(clients)
    return rt


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
    executor = runtime(ctx).executor
    if assignment.action is AssignmentAction.cancel:
        stored = ref.get().to_dict() or {}
        original = Assignment.model_validate(stored["assignment"]) if stored.get("assignment") else assignment
        _publish_end(ctx, original, executor.cancel_attempt(original, reason="cancelled by user"))
        return
    lease_by = uuid.uuid4().hex  # this delivery, in the record's start lease
    underway, stored = _record_starting(db, ref, assignment, ctx.now(), lease_by)
    if underway:
        log.info("attempt %s: another delivery of its assignment is starting it (until %s): this copy starts nothing",
                 assignment.attempt_id, stored.get(ExecutionDoc.field("start_lease_until")))
        return
    if stored is not None:  # a redelivery (or a late copy) of an attempt that started or is over
        if not decide.is_over(stored):
            # Started: the executor may have died between recording it and publishing `started` (this copy is
            # then the redelivery of an unacknowledged push). Published again; the scheduler ignores a repeat.
            ctx.publish("attempt-events", decide.started_event(assignment, ctx.now()))
        return
    try:
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
            _publish_end(ctx, assignment, decide.start_failure(result.outcome, _node_state(db, assignment.node)))
        return
    ref.set(decide.started_record(ctx.now()), merge=True)
    # Also when the workers already ran it (`result.already`): the delivery that launched it may have died
    # before publishing. The scheduler ignores a repeat.
    ctx.publish("attempt-events", decide.started_event(assignment, ctx.now()))


def _started_meanwhile(ref) -> bool:
    """Another delivery of the assignment started the attempt while this one tried (both read `starting`): this
    one's failure (an SSH connect that failed a moment) is not the end of an attempt whose command runs."""
    return (ref.get().to_dict() or {}).get("state") == decide.STARTED


def _record_starting(db, ref, assignment: Assignment, now: datetime, lease_by: str) -> tuple[bool, dict | None]:
    """Write the attempt's record as `starting`, with this delivery's lease on it: (False, None). Unless it says the
    attempt started or ended: (False, the record), unchanged; or another delivery's lease on it runs: (True, the
    record). Guarded: a copy that read `starting` while another delivery wrote `started` (or took the lease) reads
    again instead of writing over it."""
    until = now + timedelta(seconds=budget.start_lease_seconds())

    def decide_start(snap):
        stored = snap.to_dict()
        if not decide.to_start(stored):
            return WriteSet(), (False, stored)
        if decide.start_underway(stored, now):
            return WriteSet(), (True, stored)
        record = decide.start_record(assignment, now) | decide.start_lease(until, lease_by)
        return WriteSet().update(snap, record), (False, None)

    return read_decide_commit(db, [ref], decide_start)


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


def _node_state(db, node: str) -> NodeState:
    return decide.node_state(_tpu_doc(db, node))


def _judge(ctx: Context, stored: dict, probed: decide.Probed = decide.Probed()) -> None:
    assignment = Assignment.model_validate(stored["assignment"])
    executor = runtime(ctx).executor
    tpu = _tpu_doc(ctx.clients.firestore, assignment.node)
    problem = decide.node_problem(tpu) or probed.problem
    decision = executor.read_outcome(assignment, decide.node_state(tpu), probed.lost, probed.unwritable,
                                     node_problem=problem)
    if not isinstance(decision, Decided):
        return
    _publish_end(ctx, assignment, decision)
    if problem and decision.outcome is AttemptOutcome.infra_failed:
        # Its node turned unhealthy while it ran: the end is published (the job is retried elsewhere), so stop
        # what may still run there, or two attempts of the job would run at once. No cancel marker: the attempt
        # did not end cancelled. Best effort: the janitor deletes the quarantined TPU in any case.
        try:
            executor.cancel_attempt(assignment, reason=f"stopped: node unhealthy: {problem}", marker=False)
        except Exception as e:  # noqa: BLE001 - the end is published; the node is deleted anyway
            log.warning("attempt %s: could not stop its workers on the unhealthy node: %s", assignment.attempt_id, e)


def _probe(ctx: Context, ref, stored: dict) -> decide.Probed:
    """Ask the workers, at most once per PROBE_EVERY per attempt, whether the attempt still runs there: a
    supervisor killed with its host (or by the OOM killer) leaves no status object to wake us, and one whose
    status object GCS refused leaves only its local copy, which says why."""
    now = ctx.now()
    every = runtime(ctx).probe_every
    if every is None or not decide.probe_due(stored, now, every):
        return decide.Probed()
    assignment = Assignment.model_validate(stored["assignment"])
    answers = decide.probed(runtime(ctx).executor.probe_attempt(assignment))
    since = decide.unreachable_since(stored, answers, now)
    ref.set(ExecutionDoc.fields(probed_at=now, unreachable_since=since), merge=True)
    return decide.unreachable_problem(answers, since, now, max(UNREACHABLE_PROBES * every, UNREACHABLE_MIN))


def on_status_object(event: GcsObjectEvent, ctx: Context) -> None:
    ref_name = gcslayout.parse_status_object_name(event.name)
    if ref_name is None:
        return  # not a status object: bundles, logs, submitted job files
    stored = _execution_ref(ctx.clients.firestore, ref_name.job_id, ref_name.attempt).get().to_dict()
    if decide.judgeable(stored):
        _judge(ctx, stored)


def on_tick(tick: Tick, ctx: Context) -> None:
    from google.cloud import firestore

    # Only started attempts: one stuck in `starting` must not take a place in the batch for ever.
    query = (ctx.clients.firestore.collection(EXECUTIONS)
             .where(filter=firestore.FieldFilter("ended", "==", False))
             .where(filter=firestore.FieldFilter("state", "==", decide.STARTED)).limit(TICK_BATCH))
    # Each attempt isolated: one that cannot be judged never stops the others. Not raised: the next tick
    # is the retry, and redelivering this one would probe the others' workers again.
    attempts = Isolated("executor tick", log)
    for snap in query.stream():
        stored = snap.to_dict() or {}
        if not decide.judgeable(stored):
            continue
        with attempts.part(f"judging {snap.id}"):
            _judge(ctx, stored, _probe(ctx, snap.reference, stored))
    with attempts.part("closing connections to nodes that left"):
        _forget_departed_nodes(ctx)


def _forget_departed_nodes(ctx: Context) -> None:
    """Close the SSH connections kept to nodes whose TPU is gone (or was never stored): one read per node kept."""
    rt = runtime(ctx)
    if "executor" not in rt.__dict__ or rt.executor.connection_cache is None:
        return  # nothing was ever connected by this instance
    kept = rt.executor.connection_cache.nodes()
    if not kept:
        return
    db = ctx.clients.firestore
    refs = {short_node_name(node): node for node in kept}
    holding = {snap.id for snap in db.get_all([db.collection(store.TPUS).document(s) for s in refs])
               if snap.exists and (snap.to_dict() or {}).get("state") in TPU_STATES_IN_SERVICE}
    closed = rt.executor.forget_nodes({node for short, node in refs.items() if short not in holding})
    if closed:
        log.info("closed %d SSH connections to nodes that left", closed)


def build_service() -> Service:
    return Service(name="executor", handlers={
        "/push/assignments": on_assignment,
        "/push/gcs-status": on_status_object,
        "/push/ticks": on_tick,
    })
