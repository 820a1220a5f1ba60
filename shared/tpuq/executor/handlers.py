"""The executor service: assignments in, attempt events out.

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
from datetime import datetime, timedelta
from functools import cached_property

import paramiko

from tpuq import store
from tpuq.documents import ExecutionEnd, ExecutionState, TpuState, execution_doc_id, short_node_name
from tpuq.errors import Permanent
from tpuq import gcslayout
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.pins import GuestAttributeHostKeys
from tpuq.fleetstore import load_fleet
from tpuq.executor.workerspec import WorkerSettings
from tpuq.messages import Assignment, AssignmentAction, AttemptOutcome, AttemptEvent, AttemptEventKind, GcsObjectEvent, Tick
from tpuq.service import Context, Service

log = logging.getLogger("tpuq.executor")
EXECUTIONS = store.EXECUTIONS
TICK_BATCH = 50
# How often a running attempt's workers are asked whether it still runs (SSH to every worker).
PROBE_EVERY = timedelta(seconds=float(os.environ.get("TPUQ_EXECUTOR_PROBE_SECONDS", "60")))


class FirestorePinStore:
    """Host-key pins in `tpus/{node}.host_keys`, first writer wins (a transaction per node)."""

    def __init__(self, db):
        self.db = db

    def _ref(self, node: str):
        return self.db.collection(store.TPUS).document(short_node_name(node))

    def get_pins(self, node: str):
        snap = self._ref(node).get()
        return {int(k): v for k, v in ((snap.to_dict() or {}).get("host_keys") or {}).items()} if snap.exists else {}

    def add_pins(self, node: str, pins):
        from google.cloud import firestore

        ref = self._ref(node)

        @firestore.transactional
        def merge(tx):
            snap = ref.get(transaction=tx)
            current = {int(k): v for k, v in ((snap.to_dict() or {}).get("host_keys") or {}).items()}
            for worker, key in pins.items():
                current.setdefault(int(worker), key)
            tx.set(ref, {"host_keys": {str(k): v for k, v in current.items()}}, merge=True)
            return current

        return merge(self.db.transaction())

    def forget(self, node: str) -> None:
        from google.cloud import firestore

        self._ref(node).set({"host_keys": firestore.DELETE_FIELD}, merge=True)


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
            ssh_user=os.environ.get("TPUQ_SSH_USER", "tpuq"),
            ssh_key=lambda: key,
            pin_store=FirestorePinStore(self.clients.firestore),
            # Host keys come from the nodes' guest attributes (roles/tpu.viewer), never from a first connection.
            host_keys=GuestAttributeHostKeys(self.clients.tpu),
            objects=GcsObjectStore(self.clients.storage),
            clock=lambda: datetime.now(timezone.utc),
            settings=settings,
            ssh_transport=lambda: load_fleet(self.clients.firestore).ssh_transport,
        )


_RUNTIMES: dict[int, ExecutorRuntime] = {}


def runtime(ctx: Context) -> ExecutorRuntime:
    rt = _RUNTIMES.get(id(ctx.clients))
    if rt is None:
        rt = _RUNTIMES[id(ctx.clients)] = ExecutorRuntime(ctx.clients)
    return rt


def _execution_ref(db, job_id: str, attempt: int):
    return db.collection(EXECUTIONS).document(execution_doc_id(job_id, attempt))


def _publish_end(ctx: Context, assignment: Assignment, decided: Decided) -> None:
    """Publish the attempt's end once: the execution document remembers that it was published."""
    ref = _execution_ref(ctx.clients.firestore, assignment.job_id, assignment.attempt)
    snap = ref.get()
    if snap.exists and (snap.to_dict() or {}).get("ended"):
        return
    ctx.publish("attempt-events", AttemptEvent(
        kind=AttemptEventKind.ended, job_id=assignment.job_id, attempt=assignment.attempt,
        attempt_id=assignment.attempt_id, node=assignment.node, outcome=decided.outcome,
        detail=(decided.detail or "")[:8000], exit_codes=decided.exit_codes, at=ctx.now()))
    ref.set(ExecutionEnd(decided.outcome.value, (decided.detail or "")[:2000], ctx.now()).to_doc(), merge=True)
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
    snap = ref.get()
    if snap.exists and (snap.to_dict() or {}).get("ended"):
        return  # a redelivery of an attempt that is over
    ref.set({"job_id": assignment.job_id, "attempt": assignment.attempt, "attempt_id": assignment.attempt_id,
             "node": assignment.node, "assignment": assignment.model_dump(mode="json"), "state": ExecutionState.starting.value,
             "ended": False, "received_at": ctx.now()}, merge=True)
    try:
        result = executor.start_attempt(assignment)
    except Permanent as e:
        # It can never run (no endpoints, no bucket, env overriding runner variables): end the attempt so the
        # job does not sit in `assigned` for ever, and the TPU is not held.
        _publish_end(ctx, assignment, Decided(AttemptOutcome.failed_setup, f"cannot start: {e}"))
        return
    if result.outcome is not None:
        outcome = result.outcome
        if outcome.outcome is AttemptOutcome.infra_failed and _node_state(db, assignment.node) is NodeState.preempted:
            # Unreachable because the node was preempted meanwhile: that is a preemption, with its own budget.
            outcome = Decided(AttemptOutcome.preempted, f"node preempted: {outcome.detail}", outcome.exit_codes)
        _publish_end(ctx, assignment, outcome)
        return
    ref.set({"state": ExecutionState.started.value, "started_at": ctx.now()}, merge=True)
    if not result.already:
        ctx.publish("attempt-events", AttemptEvent(
            kind=AttemptEventKind.started, job_id=assignment.job_id, attempt=assignment.attempt,
            attempt_id=assignment.attempt_id, node=assignment.node, at=ctx.now()))


def _node_state(db, node: str) -> NodeState:
    snap = db.collection(store.TPUS).document(short_node_name(node)).get()
    if not snap.exists:
        return NodeState.unknown
    return NodeState.preempted if (snap.to_dict() or {}).get("state") == TpuState.gone else NodeState.ready


def _judge(ctx: Context, stored: dict, probed: tuple[frozenset[int], dict[int, str]] = (frozenset(), {})) -> None:
    assignment = Assignment.model_validate(stored["assignment"])
    lost_workers, unwritable_statuses = probed
    decision = runtime(ctx).executor.read_outcome(assignment, _node_state(ctx.clients.firestore, assignment.node),
                                                  lost_workers, unwritable_statuses)
    if isinstance(decision, Decided):
        _publish_end(ctx, assignment, decision)


def _lost_workers(ctx: Context, ref, stored: dict) -> tuple[frozenset[int], dict[int, str]]:
    """Ask the workers, at most once per PROBE_EVERY per attempt, whether the attempt still runs there: a
    supervisor killed with its host (or by the OOM killer) leaves no status object to wake us, and one whose
    status object GCS refused leaves only its local copy, which says why. -> (lost workers, worker -> why)"""
    now = ctx.now()
    started_at, probed_at = stored.get("started_at"), stored.get("probed_at")
    if started_at is None or now - started_at < PROBE_EVERY or (probed_at and now - probed_at < PROBE_EVERY):
        return frozenset(), {}
    ref.set({"probed_at": now}, merge=True)
    assignment = Assignment.model_validate(stored["assignment"])
    probes = runtime(ctx).executor.probe_attempt(assignment)
    return (frozenset(w for w, p in probes.items() if p.lost),
            {w: p.status_error for w, p in probes.items() if p.status_error})


def on_status_object(event: GcsObjectEvent, ctx: Context) -> None:
    ref_name = gcslayout.parse_status_object_name(event.name)
    if ref_name is None:
        return  # not a status object: bundles, logs, submitted job files
    snap = _execution_ref(ctx.clients.firestore, ref_name.job_id, ref_name.attempt).get()
    stored = snap.to_dict() or {}
    if not snap.exists or stored.get("ended") or not stored.get("assignment"):
        return
    _judge(ctx, stored)


def on_tick(tick: Tick, ctx: Context) -> None:
    from google.cloud import firestore

    # Only started attempts: one stuck in `starting` must not take a place in the batch for ever.
    query = (ctx.clients.firestore.collection(EXECUTIONS)
             .where(filter=firestore.FieldFilter("ended", "==", False))
             .where(filter=firestore.FieldFilter("state", "==", ExecutionState.started)).limit(TICK_BATCH))
    for snap in query.stream():
        stored = snap.to_dict() or {}
        if not stored.get("assignment"):
            continue
        try:
            _judge(ctx, stored, _lost_workers(ctx, snap.reference, stored))
        except Exception:  # noqa: BLE001 - one bad attempt must not stop the backstop for the others
            log.exception("tick: could not judge %s", snap.id)


def build_service() -> Service:
    return Service(name="executor", handlers={
        "/push/assignments": on_assignment,
        "/push/gcs-status": on_status_object,
        "/push/ticks": on_tick,
    })
