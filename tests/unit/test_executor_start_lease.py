"""No second `prepare` beside a first still going (issue 32 §5): a delivery that starts an attempt holds a lease on
its record (tpuq.executor.decide.start_underway) for its start's budget; a copy of the assignment that arrives
meanwhile (the scheduler's tick sends one every 5 minutes while the attempt is not started; Pub/Sub delivers at
least once) starts nothing. On the in-memory Firestore and publisher."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

from tpuq.executor import budget, decide, handlers
from tpuq.executor.executor import StartResult

from tests.unit.test_executor_redelivery import ASSIGNMENT, NOW, Env, FakeExecutor


class SlowFirstStart(FakeExecutor):
    """The first start waits until the test lets it finish; any later one returns at once."""

    def __init__(self):
        super().__init__()
        self.inside = threading.Event()
        self.finish = threading.Event()

    def start_attempt(self, assignment) -> StartResult:
        self.starts.append(assignment.attempt_id)
        if len(self.starts) == 1:
            self.inside.set()
            assert self.finish.wait(10), "the test never let the first start finish"
        return StartResult(True)


def test_a_copy_delivered_while_the_first_delivery_starts_the_attempt_starts_nothing():
    env = Env(SlowFirstStart())
    first = threading.Thread(target=handlers.on_assignment, args=(ASSIGNMENT, env.ctx("executor-assignments")))
    first.start()
    try:
        assert env.executor.inside.wait(10)
        handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))  # the copy, acknowledged
        assert env.executor.starts == ["j1-1"], "a second start ran beside the first"
        assert env.attempt_events() == []
    finally:
        env.executor.finish.set()
        first.join(10)
    assert env.execution()["state"] == decide.STARTED
    assert [e["kind"] for e in env.attempt_events()] == ["started"]


def test_a_lease_left_by_a_delivery_that_died_ends_with_its_budget():
    env = Env()
    lease = timedelta(seconds=budget.start_lease_seconds())
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW) | decide.start_lease(NOW + lease, "died"))

    later = env.ctx("executor-assignments")
    later.now = lambda: NOW + lease - timedelta(seconds=1)
    handlers.on_assignment(ASSIGNMENT, later)
    assert env.executor.starts == []

    after = env.ctx("executor-assignments")
    after.now = lambda: NOW + lease  # the tick's next copy, or Pub/Sub's redelivery after the ack deadline
    handlers.on_assignment(ASSIGNMENT, after)
    assert env.executor.starts == ["j1-1"] and env.execution()["state"] == decide.STARTED


def test_a_start_that_raised_gives_its_lease_back_for_pub_subs_redelivery():
    env = Env()
    env.executor.fail_start = ConnectionResetError("the fleet document could not be read")
    with contextlib.suppress(ConnectionResetError):
        handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))
    assert env.execution()["start_lease_until"] is None

    env.executor.fail_start = None
    handlers.on_assignment(ASSIGNMENT, env.ctx("executor-assignments"))  # redelivered a second later
    assert env.executor.starts == ["j1-1", "j1-1"] and env.execution()["state"] == decide.STARTED


def test_only_the_delivery_holding_the_lease_releases_it():
    record = decide.start_record(ASSIGNMENT, NOW) | decide.start_lease(NOW + timedelta(minutes=8), "mine")
    assert decide.lease_released(record, "mine") == {"start_lease_until": None}
    assert decide.lease_released(record, "another") is None
    assert decide.lease_released({**record, "state": decide.STARTED.value}, "mine") is None
    assert decide.start_underway(record, NOW + timedelta(minutes=7))
    assert not decide.start_underway(record, NOW + timedelta(minutes=8))
    assert not decide.start_underway(decide.start_record(ASSIGNMENT, NOW), NOW)  # a record from before leases
