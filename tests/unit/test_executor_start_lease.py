"""No second `prepare` beside a first still going (issue 32 §5): a delivery that starts an attempt holds a lease on
its record (tpuq.executor.decide.start_underway), renewed while its start runs; a copy of the assignment that
arrives meanwhile (the scheduler's tick sends one every 5 minutes while the attempt is not started; Pub/Sub delivers
at least once) starts nothing beside it. A delivery that died mid-start (issue 34 §4: the chaos soak's executor
kill) leaves a lease that runs out within a minute, and the copy waiting for it starts the attempt. On the
in-memory Firestore and publisher."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

import pytest

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
    env.service.state.sleep = lambda seconds: None  # the copy's wait passes at once, the first's lease still running
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


class FakeClock:
    """The copy's clock and its sleep: sleeping moves the clock."""

    def __init__(self, start):
        self.at, self.slept = start, []

    def now(self):
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += timedelta(seconds=seconds)


def test_a_lease_left_by_a_delivery_that_died_ends_within_a_minute():
    assert budget.start_lease_seconds() <= 60 < budget.start_budget_seconds()
    env = Env()
    lease = timedelta(seconds=budget.start_lease_seconds())
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW) | decide.start_lease(NOW + lease, "died"))

    clock = FakeClock(NOW + timedelta(seconds=5))  # Pub/Sub's redelivery of the push the killed instance dropped
    env.service.state.sleep = clock.sleep
    copy = env.ctx("executor-assignments")
    copy.now = clock.now
    handlers.on_assignment(ASSIGNMENT, copy)
    # The copy waited for the dead delivery's lease to run out, then started the attempt itself.
    assert env.executor.starts == ["j1-1"] and env.execution()["state"] == decide.STARTED
    assert clock.at >= NOW + lease and sum(clock.slept) <= budget.UNDERWAY_WAIT_SECONDS
    assert [e["kind"] for e in env.attempt_events()] == ["started"]


def test_a_copy_gives_up_waiting_while_the_holder_renews_its_lease():
    env = Env()
    clock = FakeClock(NOW)
    holder_lease = lambda: decide.start_lease(clock.at + timedelta(seconds=budget.start_lease_seconds()), "alive")
    env.execution_ref().set(decide.start_record(ASSIGNMENT, NOW) | holder_lease())

    def sleep_while_the_holder_renews(seconds):
        clock.sleep(seconds)
        env.execution_ref().set(holder_lease(), merge=True)

    env.service.state.sleep = sleep_while_the_holder_renews
    copy = env.ctx("executor-assignments")
    copy.now = clock.now
    handlers.on_assignment(ASSIGNMENT, copy)
    assert env.executor.starts == [] and env.attempt_events() == []
    assert sum(clock.slept) == pytest.approx(budget.UNDERWAY_WAIT_SECONDS, abs=budget.UNDERWAY_POLL_SECONDS)


def test_a_starting_delivery_renews_its_lease_while_its_start_runs():
    env = Env(SlowFirstStart())
    env.service.state.lease_renew_seconds = 0.02
    clock = FakeClock(NOW)
    ctx = env.ctx("executor-assignments")
    ctx.now = clock.now
    first = threading.Thread(target=handlers.on_assignment, args=(ASSIGNMENT, ctx))
    first.start()
    try:
        assert env.executor.inside.wait(10)
        first_lease = env.execution()["start_lease_until"]
        clock.sleep(45)  # the start runs on: SSH, the bundle
        deadline = time.monotonic() + 10
        while env.execution()["start_lease_until"] <= first_lease and time.monotonic() < deadline:
            time.sleep(0.01)
        assert env.execution()["start_lease_until"] == NOW + timedelta(seconds=45 + budget.start_lease_seconds())
    finally:
        env.executor.finish.set()
        first.join(10)
    assert env.execution()["state"] == decide.STARTED
    assert decide.lease_renewed(env.execution(), env.execution()["start_lease_by"], NOW) is None  # started: no more


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
