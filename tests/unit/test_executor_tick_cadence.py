"""The executor's tick judges running attempts again only when something is due (`tpuq.executor.tickstate`,
issue 34 §1): a tick between the backstop cadence's runs reads one document however many attempts run, a status
event that was lost is still caught within the cadence, and a failure's grace deferred by a status event is
decided at the first tick after it ends. On the in-memory Firestore, which counts reads as Firestore bills them."""

from __future__ import annotations

import json
from datetime import timedelta

from tpuq.contracts import gcslayout, store
from tpuq.contracts.messages import AttemptOutcome, GcsObjectEvent, Tick
from tpuq.executor import decide, handlers
from tpuq.contracts.documents import NodeHealth, TpuDoc, TpuHealth
from tpuq.executor.executor import WorkerProbe
from tpuq.executor.outcome import Decided, Wait
from tpuq.runtime.settings import Settings

from tests.unit.test_executor_redelivery import ASSIGNMENT, NOW, FakeExecutor
from tests.unit.test_executor_service import deliver, memory_clients

TICK = timedelta(minutes=1)
EVERY = timedelta(minutes=5)  # the tests' backstop cadence (Settings.backstop_seconds; production: 15 minutes)
RUNNING = 4


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


class ScriptedWorkers(FakeExecutor):
    """Each attempt's outcome as `outcome(attempt_id, now)` says (default: still running); reads are counted."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock
        self.script: dict[str, object] = {}
        self.reads: list[str] = []

    def read_outcome(self, attempt, node_state=None, lost_workers=frozenset(), unwritable_statuses={},
                     node_problem=None):
        self.reads.append(attempt.attempt_id)
        if node_problem:  # as outcome.decide: the node's recorded health ends the attempt
            return Decided(AttemptOutcome.infra_failed, f"node unhealthy: {node_problem}")
        decide_at = self.script.get(attempt.attempt_id)
        return decide_at(self.clock.now) if decide_at else Wait("1 worker running")


    def probe_attempt(self, attempt):  # every worker answers: still running
        return {0: WorkerProbe(0, reachable=True, current=True, launched=True, supervisor_alive=True, job_alive=True)}


def _stack(probe: bool = False):
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner", backstop_seconds=EVERY.total_seconds())
    clients = memory_clients(settings)
    db = clients.firestore
    for i in range(RUNNING):
        assignment = ASSIGNMENT.model_copy(update={"job_id": f"j{i}", "attempt_id": f"j{i}-1",
                                                   "node": ASSIGNMENT.node.replace("j1", f"j{i}")})
        db.collection(store.EXECUTIONS).document(f"j{i}:1").set(
            decide.start_record(assignment, NOW - timedelta(minutes=10))
            | decide.started_record(NOW - timedelta(minutes=10)))
        db.collection(store.TPUS).document(assignment.node.rsplit("/", 1)[1]).set({"state": "busy"})
    clock = Clock()
    workers = ScriptedWorkers(clock)
    service = handlers.build_service(settings, clients, executor=workers, probe=probe)
    service.now = clock
    return clients, service, workers, clock


def _tick(service, clients, clock, at) -> int:
    clock.now = at
    before = clients.firestore.billed.reads
    assert deliver(service, "executor-ticks", Tick(at=at), message_id=f"t{at.isoformat()}") == 204
    return clients.firestore.billed.reads - before


def _ended(clients) -> list[dict]:
    taken = clients.publisher.take(clients.settings.topic_path("attempt-events"))
    return [e for e in (json.loads(m.data) for m in taken) if e["kind"] == "ended"]


def test_a_tick_between_the_cadences_runs_reads_one_document_however_many_attempts_run():
    clients, service, workers, clock = _stack()
    _tick(service, clients, clock, NOW)  # the cadence's run: every running attempt judged
    assert sorted(workers.reads) == [f"j{i}-1" for i in range(RUNNING)]
    # HEAD read every running attempt's record and its node's, every tick: 2 x RUNNING.
    assert [_tick(service, clients, clock, NOW + n * TICK) for n in (1, 2, 3)] == [1, 1, 1]
    assert _ended(clients) == []


def test_an_end_whose_status_event_was_lost_is_published_within_the_cadence():
    clients, service, workers, clock = _stack()
    _tick(service, clients, clock, NOW)  # the cadence's run, just before the loss
    ended_at = NOW + timedelta(seconds=30)  # j2's status object is written; its event never arrives
    workers.script["j2-1"] = lambda now: (Decided(AttemptOutcome.succeeded, "all 1 workers exited 0")
                                          if now >= ended_at else Wait("running"))
    published, minute = None, 1
    while published is None and minute <= 10:
        _tick(service, clients, clock, NOW + minute * TICK)
        if (ended := _ended(clients)):
            assert [e["attempt_id"] for e in ended] == ["j2-1"] and ended[0]["outcome"] == "succeeded"
            published = NOW + minute * TICK
        minute += 1
    assert published is not None and published - ended_at <= EVERY + TICK


def test_a_failures_grace_deferred_by_a_status_event_is_decided_at_the_first_tick_after_it():
    clients, service, workers, clock = _stack()
    _tick(service, clients, clock, NOW)  # the cadence's run: the next is 5 minutes away
    grace_ends = NOW + timedelta(seconds=90)
    workers.script["j1-1"] = lambda now: (Decided(AttemptOutcome.failed, "worker 0 exited 1")
                                          if now >= grace_ends else Wait("worker 0 failed", until=grace_ends))
    clock.now = NOW + timedelta(seconds=10)  # worker 0's status object arrives: the decision waits for the grace
    event = GcsObjectEvent(bucket="b", name=gcslayout.worker_status_name("j1", 1, 0))
    assert deliver(service, "executor-gcs-status", event, message_id="s1") == 204
    assert _ended(clients) == []
    _tick(service, clients, clock, NOW + TICK)
    assert _ended(clients) == []  # 60 s: within the grace
    _tick(service, clients, clock, NOW + 2 * TICK)
    ended = _ended(clients)  # 120 s: the first tick after the grace, not the cadence's (300 s)
    assert [e["attempt_id"] for e in ended] == ["j1-1"] and ended[0]["outcome"] == "failed"


def test_a_node_turned_unhealthy_under_an_attempt_ends_it_at_the_next_probe_not_at_the_backstop():
    """No event tells the executor that a node turned unhealthy (the scheduler records tpus/{node}.node_health):
    a probe due reads it too, so the attempt ends within a probe interval (60 s), not the backstop's 5 minutes."""
    clients, service, workers, clock = _stack(probe=True)
    _tick(service, clients, clock, NOW)  # the cadence's run: the next is 5 minutes away
    assert _ended(clients) == []
    sick = ASSIGNMENT.node.replace("j1", "j2").rsplit("/", 1)[1]
    health = NodeHealth.from_api({"health": TpuHealth.UNHEALTHY_TENSORFLOW.value}).to_doc()
    clients.firestore.collection(store.TPUS).document(sick).update(TpuDoc.fields(node_health=health))
    _tick(service, clients, clock, NOW + TICK + timedelta(seconds=1))  # a probe is due: the backstop is not
    ended = _ended(clients)
    assert [e["attempt_id"] for e in ended] == ["j2-1"] and ended[0]["outcome"] == "infra_failed"
