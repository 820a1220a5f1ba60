"""Nothing stays assigned for ever: an attempt the executor never starts is sent again by the tick, and once it was
sent often enough, long enough ago (`lifecycle.unstarted_assignment`), it ends infra_failed, the job is retried on
its infrastructure budget and its TPU freed and quarantined (issue 32 §4)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc
from tpuq.contracts.fleet import RetryBudgets
from tpuq.contracts.messages import Tick
from tpuq.scheduler import handlers, lifecycle
from tpuq.runtime.settings import Settings

from tests.scheduler.conftest import active, utc
from tests.scheduler.test_attempts import ended, started
from tests.scheduler.test_reconcile import tick_context

EVERY = Settings(project="tpuq-local").republish_assignment_after  # TPUQ_REPUBLISH_ASSIGNMENT_SECONDS unset


def assigned_job(sched, **spec) -> dict:
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train", **spec})
    sched.deliver("fleet-events", active("n1"))
    (first,) = sched.drain("assignments")
    assert first["attempt_id"] == "j1-1" and sched.job("j1")["state"] == "assigned"
    sched.drain("capacity")  # the job's request before n1 came, and its withdrawal
    return first


def tick(sched, later: timedelta, seq: int = 1, times: int = 1) -> None:
    ctx = tick_context(sched, later)
    for _ in range(times):
        handlers.on_tick(Tick(seq=seq), ctx)


def resend_three_times(sched) -> None:
    """The ticks at 5, 10 and 15 minutes: each sends the same assignment again."""
    for n in (1, 2, 3):
        tick(sched, n * EVERY + timedelta(seconds=1), seq=n)
        sent = sched.drain("assignments")
        assert [(m["action"], m["attempt_id"]) for m in sent] == [("assign", "j1-1")], n
    assert sched.job("j1")["state"] == "assigned" and sched.job("j1")["assignment_republishes"] == 3


def test_an_attempt_never_started_ends_infra_failed_and_the_job_is_retried_on_another_tpu(sched):
    assigned_job(sched)
    resend_three_times(sched)
    tick(sched, timedelta(minutes=19), seq=4)  # sent 4 times, but not yet 20 minutes: a slow start is kept
    assert sched.job("j1")["state"] == "assigned" and sched.drain("assignments") == []

    tick(sched, timedelta(minutes=20, seconds=1), seq=5)
    job = sched.job("j1")
    assert job["state"] == "pending" and job["infra_failures"] == 1 and job["tpu"] is None
    assert "infrastructure failure: retry 1 of 2" in job["reason"]
    assert "the executor never started attempt j1-1: assigned at " in job["reason"]
    assert job["reason"].endswith("sent 4 times")
    attempt = sched.attempts("j1")["1"]
    assert attempt["state"] == "ended" and attempt["outcome"] == "infra_failed"
    tpu = sched.tpu("n1")
    assert tpu["state"] == "idle" and tpu["job_id"] is None  # released...
    assert tpu["quarantined"] is True and "j1-1" in tpu["quarantine_reason"]  # ...for the janitor to delete
    # The tick's pass asks for another slice for the retry instead of reusing the suspect one.
    assert sched.drain("assignments") == []
    assert [m["action"] for m in sched.drain("capacity")] == ["request"]

    assert job["not_before"] is not None  # retried after its back-off, on a new slice, as attempt 2
    handlers.on_fleet_event(active("n2"), tick_context(sched, timedelta(minutes=21)))
    (retry,) = sched.drain("assignments")
    assert retry["attempt_id"] == "j1-2" and retry["node"].endswith("/n2")
    assert sched.job("j1")["assignment_republishes"] == 0  # counted per attempt


def test_a_redelivered_tick_changes_nothing_more(sched):
    assigned_job(sched)
    resend_three_times(sched)
    tick(sched, timedelta(minutes=20, seconds=1), seq=4, times=2)  # the same tick delivered twice
    job = sched.job("j1")
    assert job["state"] == "pending" and job["infra_failures"] == 1
    tick(sched, timedelta(minutes=21), seq=5)
    assert sched.job("j1")["infra_failures"] == 1 and sched.job("j1")["updated_at"] == job["updated_at"]
    assert sched.drain("assignments") == []


def test_a_start_before_the_bound_keeps_the_attempt(sched):
    assigned_job(sched)
    resend_three_times(sched)
    sched.deliver("attempt-events", started())  # slow, but it started
    tick(sched, timedelta(minutes=25), seq=4)
    assert sched.job("j1")["state"] == "running"
    assert sched.tpu("n1")["state"] == "busy" and not sched.tpu("n1").get("quarantined")
    assert sched.drain("assignments") == []


def test_a_start_after_the_end_changes_nothing_but_when_it_began(sched):
    assigned_job(sched)
    resend_three_times(sched)
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    before = sched.job("j1")
    sched.deliver("attempt-events", started())
    sched.deliver("attempt-events", ended("succeeded"))
    after = sched.job("j1")
    # The late start is recorded (the attempt did begin: the retry is told TPUQ_RESUMING), nothing else changes.
    unchanged = {k: v for k, v in before.items() if k != "started_at"}
    assert {k: v for k, v in after.items() if k != "started_at"} == unchanged
    assert after["started_at"] == started().at and sched.attempts("j1")["1"]["outcome"] == "infra_failed"


def test_the_end_loses_to_a_start_that_commits_while_it_is_decided(sched, monkeypatch):
    assigned_job(sched)
    resend_three_times(sched)
    decide = lifecycle.unstarted_assignment
    calls = []

    def start_lands_meanwhile(*args, **kwargs):
        if not calls:  # the `started` event commits between the tick's read and its write
            sched.deliver("attempt-events", started(), times=1)
        calls.append(args[0]["state"])
        return decide(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "unstarted_assignment", start_lands_meanwhile)
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    assert calls == ["assigned", "running"]  # the guarded end failed and was decided again on what the start wrote
    assert sched.job("j1")["state"] == "running" and sched.tpu("n1")["state"] == "busy"
    assert sched.attempts("j1")["1"]["state"] == "running"


def test_an_attempt_the_executor_recorded_started_is_sent_again_not_ended(sched):
    """Its `started` event was lost: the republish makes the executor publish one again."""
    assigned_job(sched)
    sched.db.collection(store.EXECUTIONS).document("j1:1").set({"job_id": "j1", "attempt": 1, "state": "started",
                                                                "ended": False})
    resend_three_times(sched)
    tick(sched, timedelta(minutes=30), seq=4)
    assert sched.job("j1")["state"] == "assigned" and len(sched.drain("assignments")) == 1


def test_a_job_whose_cancel_was_asked_gets_its_cancel_again_and_ends_cancelled(sched):
    assigned_job(sched)
    sched.deliver("cancels", {"job_id": "j1", "reason": "not needed"})
    assert {m["action"] for m in sched.drain("assignments")} == {"cancel"}  # once per delivery
    for n in (1, 2, 3):
        tick(sched, n * EVERY + timedelta(seconds=1), seq=n)
        assert [m["action"] for m in sched.drain("assignments")] == ["cancel"]
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    assert sched.job("j1")["state"] == "cancelled"
    assert sched.tpu("n1")["state"] == "idle" and sched.tpu("n1")["quarantined"] is True


# ------------------------------------------------------------------ the pure decision


def job_doc(assigned_at: datetime, republishes: int, last: datetime | None, state: str = "assigned") -> dict:
    return {"id": "j1", "state": state, "spec": {"tpu": ["v4-8"], "command": "x"}, "attempt": 1,
            "attempt_id": "j1-1", "tpu": "projects/p/locations/z/nodes/n1", "assigned_at": assigned_at,
            **JobDoc.fields(assignment_republishes=republishes, assignment_republished_at=last)}


def decide(stored: dict, now: datetime, execution: dict | None = None) -> lifecycle.UnstartedAssignment:
    return lifecycle.unstarted_assignment(stored, execution, now, EVERY, RetryBudgets(), random.Random(1))


def test_the_bound_needs_both_the_time_and_the_sends():
    t0 = utc(2026, 1, 1)
    # 20 minutes, but sent only once (the ticks stopped meanwhile): sent again, not ended
    late = decide(job_doc(t0, 0, None), t0 + timedelta(hours=1))
    assert late.end is None and late.republish == JobDoc.fields(assignment_republished_at=t0 + timedelta(hours=1),
                                                                 assignment_republishes=1)
    # sent 4 times within 20 minutes (a short republish interval): kept
    assert decide(job_doc(t0, 3, t0 + timedelta(minutes=15)), t0 + timedelta(minutes=19, seconds=59)) == \
        lifecycle.UnstartedAssignment()
    both = decide(job_doc(t0, 3, t0 + timedelta(minutes=15)), t0 + timedelta(minutes=20))
    assert both.end is not None and both.end.decision.next_state == "pending"
    assert both.detail == "the executor never started attempt j1-1: assigned at 2026-01-01T00:00:00Z, sent 4 times"
    assert lifecycle.UNSTARTED_FOR == timedelta(minutes=20) and lifecycle.UNSTARTED_REPUBLISHES == 3


def test_a_job_no_longer_assigned_is_left_alone():
    t0 = utc(2026, 1, 1)
    for state in ("running", "pending", "succeeded"):
        assert decide(job_doc(t0, 3, t0, state=state), t0 + timedelta(hours=1)) == lifecycle.UnstartedAssignment()


def test_one_recorded_as_ended_by_the_executor_is_left_to_the_ended_attempt_backstop():
    t0 = utc(2026, 1, 1)
    record = {"state": "started", "ended": True, "outcome": "succeeded", "ended_at": t0}
    assert decide(job_doc(t0, 3, t0), t0 + timedelta(hours=1), record).end is None
    starting = {"state": "starting", "ended": False, "received_at": t0}
    assert decide(job_doc(t0, 3, t0), t0 + timedelta(hours=1), starting).end is not None  # received, never started


def test_a_copy_the_executor_receives_after_the_end_is_dropped(sched):
    """The end is recorded in the executor's own record too, so a late copy of the assignment (the executor back
    from a long outage, Pub/Sub still retrying) is not run beside the retry (`executor.decide.to_start`)."""
    from tpuq.executor import decide as executor_decide

    assigned_job(sched)
    resend_three_times(sched)
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    record = sched.db.collection(store.EXECUTIONS).document("j1:1").get().to_dict()
    assert record["ended"] is True and record["outcome"] == "infra_failed" and record["ended_by"] == "scheduler"
    assert not executor_decide.to_start(record) and executor_decide.is_over(record)


def test_the_end_loses_to_an_executor_that_begins_the_attempt_meanwhile(sched, monkeypatch):
    """The executor records `starting` between the tick's read and its write: the end does not commit, and the
    attempt is the executor's (a start takes up to one push, `lifecycle.STARTING_FOR`)."""
    from tpuq.executor import decide as executor_decide
    from tpuq.contracts.messages import Assignment

    first = assigned_job(sched)
    resend_three_times(sched)
    decide = lifecycle.unstarted_assignment
    calls = []

    def executor_begins_meanwhile(stored, execution, now, *args, **kwargs):
        if not calls:
            record = executor_decide.start_record(Assignment.model_validate(first), now)
            sched.db.collection(store.EXECUTIONS).document("j1:1").set(record)
        calls.append((execution or {}).get("state"))
        return decide(stored, execution, now, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "unstarted_assignment", executor_begins_meanwhile)
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    assert calls == [None, "starting"]  # the guarded end failed and was decided again on the executor's record
    assert sched.job("j1")["state"] == "assigned" and sched.tpu("n1")["state"] == "busy"


def test_a_start_that_died_long_ago_does_not_hold_the_attempt():
    job = {"id": "j1", "state": "assigned", "attempt": 1, "attempt_id": "j1-1", "tpu": "n1",
           "assigned_at": utc(2026, 1, 1), "assignment_republishes": 3}
    now = utc(2026, 1, 1, 0, 30)
    budgets = RetryBudgets()
    fresh = {"state": "starting", "ended": False, "received_at": now - timedelta(minutes=2)}
    stale = {"state": "starting", "ended": False, "received_at": now - lifecycle.STARTING_FOR}
    assert lifecycle.unstarted_assignment(job, fresh, now, EVERY, budgets, random.Random(1)).end is None
    assert lifecycle.unstarted_assignment(job, stale, now, EVERY, budgets, random.Random(1)).end is not None
