"""The executor's assignment handler under at-least-once delivery, on the in-memory Firestore and publisher.

The chaos soak's stall (seed 17, chaos-17-0002): the attempt started (record `started`, `started` published),
its node was preempted, and a late copy of the same assignment push then wrote the record back to `starting`
and died with the executor while it tried to start the attempt again on the dead node. Nothing redelivers a
copy whose original was acked, and the executor's tick judges only `started` attempts: the job stayed
`running` for ever. A copy of the assignment of an attempt that started must leave its record alone.
"""

from __future__ import annotations

import contextlib
import json
import random
from datetime import datetime, timezone

from tpuq.contracts import store, topology
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import execution_doc_id, short_node_name
from tpuq.executor import decide, handlers
from tpuq.executor.executor import StartResult
from tpuq.executor.outcome import NodeState, decide_outcome
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher
from tpuq.contracts.messages import Assignment, Tick, WorkerEndpoint
from tpuq.runtime.service import Context

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
NODE = "projects/tpuq-local/locations/us-central2-b/nodes/tpuq-r-j1-1-us-central2-b"
ASSIGNMENT = Assignment(job_id="j1", attempt=1, attempt_id="j1-1", node=NODE, zone="us-central2-b",
                        endpoints=[WorkerEndpoint(worker_id=0, ip="127.0.0.9", port=22)], at=NOW)


class FakeExecutor:
    """The executor's SSH/GCS shell: starts succeed unless `fail_start` is set; no status object is written."""

    connection_cache = None

    def __init__(self):
        self.starts: list[str] = []
        self.fail_start: BaseException | None = None

    def start_attempt(self, assignment: Assignment) -> StartResult:
        self.starts.append(assignment.attempt_id)
        if self.fail_start is not None:
            raise self.fail_start
        return StartResult(True)

    def read_outcome(self, attempt, node_state=NodeState.unknown, lost_workers=frozenset(), unwritable_statuses={},
                     node_problem=None):
        return decide_outcome(worker_count=1, statuses={}, node_state=node_state, now=NOW, lost_workers=lost_workers,
                              unwritable_statuses=unwritable_statuses, node_problem=node_problem)


class Env:
    """The executor service as build_service makes it, on the in-memory Firestore and publisher, with `executor`
    (a FakeExecutor unless given) as its shell; its workers are never probed."""

    def __init__(self, executor: FakeExecutor | None = None):
        self.settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner")
        self.publisher = MemoryPublisher(self.settings.topic_path(t.name) for t in topology.TOPICS)
        self.clients = Clients(self.settings, firestore=MemoryFirestore(project="tpuq-local"), publisher=self.publisher)
        self.executor = executor if executor is not None else FakeExecutor()
        self.service = handlers.build_service(self.settings, self.clients, executor=self.executor, probe=False)

    def ctx(self, subscription: str) -> Context:
        sub = next(s for s in topology.SUBSCRIPTIONS if s.name == subscription)
        return Context(clients=self.clients, now=lambda: NOW, rng=random.Random(0), message_id="m1", attributes={},
                       publish_time=NOW, subscription=sub, service="executor", settings=self.settings,
                       state=self.service.state)

    @property
    def db(self):
        return self.clients.firestore

    def execution_ref(self):
        return self.db.collection(store.EXECUTIONS).document(execution_doc_id("j1", 1))

    def execution(self) -> dict:
        return self.execution_ref().get().to_dict()

    def attempt_events(self) -> list[dict]:
        return [json.loads(m.data) for m in self.publisher.take(self.settings.topic_path("attempt-events"))]


def test_a_late_copy_of_a_started_attempts_assignment_leaves_it_to_the_tick():
    env = Env()
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.execution()["state"] == decide.STARTED
    assert [e["kind"] for e in env.attempt_events()] == ["started"]

    # The node is preempted; then the late copy arrives, and its handler dies while it starts the attempt
    # again on the dead node (the executor was killed): its answer goes nowhere, nothing delivers it again.
    env.executor.fail_start = ConnectionResetError("the executor was killed while it started the copy")
    with contextlib.suppress(ConnectionResetError):
        handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.execution()["state"] == decide.STARTED, "a copy of the assignment wrote the started record back"
    assert env.executor.starts == ["j1-1"], "the attempt's workers were asked to start it again"
    # `started` once more (the scheduler ignores a repeat): the copy may be the redelivery of a push whose
    # handler died between recording `started` and publishing it.
    assert [e["kind"] for e in env.attempt_events()] == ["started"]

    # The scheduler recorded the node lost: the executor's tick judges the attempt and publishes its end.
    env.db.collection(store.TPUS).document(short_node_name(NODE)).set({"state": "gone"})
    handlers.on_tick(Tick(at=NOW), env.ctx("executor-ticks"))
    ended = env.attempt_events()
    assert [(e["kind"], e["outcome"], e["attempt_id"]) for e in ended] == [("ended", "preempted", "j1-1")]
    assert env.execution()["ended"] is True


def test_a_copy_racing_the_first_delivery_never_writes_starting_over_started(monkeypatch):
    """The copy read `starting` (the first delivery was launching), and the first delivery wrote `started`
    before the copy wrote its own record: the copy's write is refused, and on a fresh read it leaves the
    attempt alone."""
    env = Env()
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW))  # the first delivery's record, mid-start
    ref = env.execution_ref()
    original = decide.start_record
    raced = []

    def first_delivery_finishes_meanwhile(assignment, now):
        if not raced:
            raced.append(True)
            ref.set(decide.started_record(now), merge=True)
        return original(assignment, now)

    monkeypatch.setattr(decide, "start_record", first_delivery_finishes_meanwhile)
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert raced, "the copy never read the record as `starting`"
    assert env.execution()["state"] == decide.STARTED
    assert env.executor.starts == []


def test_a_redelivery_of_an_attempt_still_starting_starts_it():
    """A delivery that died mid-start is redelivered (it was never acked): that one must still start it."""
    env = Env()
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW))
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.executor.starts == ["j1-1"]
    assert env.execution()["state"] == decide.STARTED
    assert [e["kind"] for e in env.attempt_events()] == ["started"]


def test_an_executor_that_died_between_recording_started_and_publishing_it_publishes_it_on_redelivery():
    env = Env()
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW))
    env.execution_ref().set(decide.started_record(NOW), merge=True)  # ... and then the executor died: no event
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))  # Pub/Sub redelivers the unacked push
    assert [e["kind"] for e in env.attempt_events()] == ["started"]
    assert env.executor.starts == [], "a started attempt was started again"


def test_a_copy_of_an_ended_attempts_assignment_publishes_nothing():
    env = Env()
    env.execution_ref().set({**decide.start_record(ASSIGNMENT, NOW), "ended": True})
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.attempt_events() == [] and env.executor.starts == []


def test_a_redelivery_that_finds_the_workers_already_running_it_publishes_started():
    """The push that launched the workers died before recording `started` (and before publishing it): the
    redelivery's start finds them running (`already`) and publishes `started` for it."""
    env = Env()
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW))
    env.executor.start_attempt = lambda a: StartResult(True, already=True)
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.execution()["state"] == decide.STARTED
    assert [e["kind"] for e in env.attempt_events()] == ["started"]


def test_a_copy_whose_start_fails_after_the_other_copy_started_the_attempt_ends_nothing():
    """Two copies read `starting` at once; the first launches the command and records `started`, the second's
    connect fails a moment later. The attempt runs: no end is published for it."""
    from tpuq.executor.outcome import Decided
    from tpuq.contracts.messages import AttemptOutcome

    env = Env()
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW))  # the first copy's record, mid-start

    def first_copy_started_it_then_this_one_fails(assignment):
        env.execution_ref().set(decide.started_record(NOW), merge=True)
        return StartResult(False, outcome=Decided(AttemptOutcome.infra_failed, "ssh: connection reset"))

    env.executor.start_attempt = first_copy_started_it_then_this_one_fails
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.attempt_events() == []
    assert env.execution()["state"] == decide.STARTED and not env.execution().get("ended")
