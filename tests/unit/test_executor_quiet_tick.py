"""The executor's tick with nothing changing (issue 34 §1): it probes each running attempt's workers on the
probe interval, kept in the instance's memory, and writes the attempt's record only when a probe changes what
it says (a worker turned unreachable, or answered again). A quiet tick therefore writes nothing and reads a small
constant per running attempt, and a worker that stops answering is still caught within its grace (plus one
probe interval), by this instance or by another that takes over. On the in-memory Firestore, which counts the
operations as Firestore bills them."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

from tpuq.contracts import store
from tpuq.contracts.messages import Tick
from tpuq.executor import decide, handlers
from tpuq.executor.executor import WorkerProbe
from tpuq.runtime.settings import Settings

from tests.unit.test_executor_redelivery import ASSIGNMENT, NOW
from tests.unit.test_executor_service import ProbedExecutor, deliver, memory_clients

EVERY = timedelta(seconds=60)
RUNNING = 4


class SwitchableWorkers(ProbedExecutor):
    """Probes answer that the attempt runs, or, once `down` holds its attempt id, that worker 0 is unreachable."""

    def __init__(self):
        super().__init__()
        self.down: set[str] = set()

    def probe_attempt(self, attempt):
        if attempt.attempt_id in self.down:
            self.probes.append(attempt.attempt_id)
            return {0: WorkerProbe(0, reachable=False, error="connection timed out")}
        return super().probe_attempt(attempt)


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


def _stack(running: int = RUNNING):
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner",
                        executor_probe_seconds=EVERY.total_seconds(), backstop_seconds=300)
    clients = memory_clients(settings)
    db = clients.firestore
    for i in range(running):
        assignment = ASSIGNMENT.model_copy(update={"job_id": f"j{i}", "attempt_id": f"j{i}-1",
                                                   "node": ASSIGNMENT.node.replace("j1", f"j{i}")})
        db.collection(store.EXECUTIONS).document(f"j{i}:1").set(
            decide.start_record(assignment, NOW - timedelta(minutes=10))
            | decide.started_record(NOW - timedelta(minutes=10)))
        db.collection(store.TPUS).document(assignment.node.rsplit("/", 1)[1]).set({"state": "busy"})
    return settings, clients


def _service(settings, clients, workers, clock):
    service = handlers.build_service(settings, clients, executor=workers, probe=True)
    service.now = clock
    return service


def _ended(clients) -> list[dict]:
    return [json.loads(m.data) for m in clients.publisher.take(clients.settings.topic_path("attempt-events"))]


def test_a_quiet_tick_writes_nothing_and_reads_a_constant_per_running_attempt():
    settings, clients = _stack()
    workers, clock = SwitchableWorkers(), Clock()
    service = _service(settings, clients, workers, clock)
    db = clients.firestore
    for minute in range(10):  # ten minutes of ticks, every worker answering
        clock.now = NOW + minute * EVERY
        before = db.billed.copy()
        assert deliver(service, "executor-ticks", Tick(at=clock.now), message_id=f"t{minute}") == 204
        spent = db.billed - before
        sweep = minute % 5 == 0  # the lost-event backstop's cadence (5 minutes here): its claim is one write
        assert spent.writes == (1 if sweep else 0), f"tick {minute} wrote {spent.writes}"
        # The tick's state document, the running attempts' records to probe them, and with each probe its
        # node's record (a node turned unhealthy brings the executor no event); on the cadence the nodes' records
        # again, to judge them: whatever the history (HEAD wrote each attempt's record at every probe: RUNNING
        # writes a minute).
        assert spent.reads <= (3 * RUNNING + 1 if sweep else 2 * RUNNING + 1), spent
    assert len(workers.probes) == 10 * RUNNING  # each attempt still probed once per interval
    assert _ended(clients) == []


def test_probes_are_throttled_in_memory_without_writing_the_record():
    settings, clients = _stack(running=1)
    workers, clock = SwitchableWorkers(), Clock()
    service = _service(settings, clients, workers, clock)
    for seconds in (0, 20, 40, 60, 70):  # ticks closer together than the interval (a re-plan, a redelivery)
        clock.now = NOW + timedelta(seconds=seconds)
        deliver(service, "executor-ticks", Tick(at=clock.now), message_id=f"t{seconds}")
    assert workers.probes == ["j0-1", "j0-1"]  # at 0 and at 60 s only
    record = clients.firestore.collection(store.EXECUTIONS).document("j0:1").get().to_dict()
    assert record.get("probed_at") is None and record.get("unreachable_since") is None


def test_a_worker_that_stops_answering_is_caught_within_its_grace_even_by_another_instance():
    settings, clients = _stack(running=2)
    workers, clock = SwitchableWorkers(), Clock()
    first = _service(settings, clients, workers, clock)
    db = clients.firestore
    grace = decide.unreachable_grace(EVERY)
    deliver(first, "executor-ticks", Tick(at=clock.now), message_id="t0")
    went_down = NOW + timedelta(seconds=30)
    workers.down.add("j1-1")
    ended_at, minute, takeover = None, 1, None
    while ended_at is None and minute < 20:
        clock.now = NOW + minute * EVERY
        before = db.billed.copy()
        # Half-way through, a second instance (its memory empty) takes the ticks over: the grace runs on from
        # the record, it does not start again.
        service = first if minute < 3 else (takeover := takeover or _service(settings, clients, workers, clock))
        deliver(service, "executor-ticks", Tick(at=clock.now), message_id=f"t{minute}")
        spent = db.billed - before
        events = [e for e in _ended(clients) if e["kind"] == "ended"]
        if events:
            assert [e["attempt_id"] for e in events] == ["j1-1"] and events[0]["outcome"] == "infra_failed"
            assert "unreachable" in events[0]["detail"]
            ended_at = clock.now
        elif minute > 1:
            assert spent.writes == 0, f"minute {minute}: the unreachable worker's record rewritten at each probe"
        minute += 1
    assert ended_at is not None and ended_at - went_down <= grace + EVERY
    record = db.collection(store.EXECUTIONS).document("j1:1").get().to_dict()
    assert record["unreachable_since"] == NOW + EVERY  # written once, by the first probe that found it down
    assert db.collection(store.EXECUTIONS).document("j0:1").get().to_dict().get("probed_at") is None


def test_a_worker_that_answers_again_clears_its_grace_once():
    since = NOW - timedelta(seconds=90)
    up = decide.probed({0: WorkerProbe(0, reachable=True)})
    down = decide.probed({0: WorkerProbe(0, reachable=False)})
    assert decide.probe_record({"unreachable_since": since}, decide.unreachable_since({}, up, NOW), NOW) == \
        {"probed_at": NOW, "unreachable_since": None}
    assert decide.probe_record({}, None, NOW) is None
    assert decide.probe_record({"unreachable_since": since}, since, NOW) is None
    assert decide.probe_record({}, decide.unreachable_since({}, down, NOW), NOW) == \
        {"probed_at": NOW, "unreachable_since": NOW}


class WorkersThatAnswerOnlyTogether(ProbedExecutor):
    """Each probe waits until `together` probes are waiting (a barrier): probed one after another, every probe
    times out. Stands for hosts that answer only after their SSH connect timeout."""

    def __init__(self, together: int, fail: str | None = None):
        super().__init__()
        self.barrier = threading.Barrier(together, timeout=5)
        self.fail = fail

    def probe_attempt(self, attempt):
        self.barrier.wait()
        if attempt.attempt_id == self.fail:
            raise RuntimeError("the SSH pool broke")
        return super().probe_attempt(attempt)


def test_a_tick_probes_its_running_attempts_together_not_one_after_another():
    # Six dead hosts, one after another at the 10 s connect timeout, held a tick past its 60 s ack deadline.
    settings, clients = _stack(running=RUNNING)
    workers, clock = WorkersThatAnswerOnlyTogether(RUNNING, fail="j2-1"), Clock()
    service = _service(settings, clients, workers, clock)
    deliver(service, "executor-ticks", Tick(at=clock.now), message_id="t0")
    # Every probe got past the barrier (one after another, the first would have waited 5 s and broken it); the
    # one whose probe failed did not stop the others, and nothing was ended for it.
    assert sorted(workers.probes) == ["j0-1", "j1-1", "j3-1"]
    assert not workers.barrier.broken
    assert _ended(clients) == []
