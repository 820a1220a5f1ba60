"""Cancelling: a pending job at once, a running one through the executor, a finished one not at all."""

from __future__ import annotations

from tpuq.contracts import store
from tpuq.contracts.messages import CancelRequest

from tests.scheduler.conftest import active
from tests.scheduler.test_attempts import ended, running_job


def test_cancel_running_job_asks_the_executor_and_ends_on_its_report(sched):
    running_job(sched)
    sched.deliver("cancels", CancelRequest(job_id="j1", reason="wrong data"))
    job = sched.job("j1")
    assert job["state"] == "running" and job["cancel_requested"] is True
    stops = sched.drain("assignments")
    # Sent on each delivery (the executor stops an attempt once): a crash after the write loses nothing.
    assert {(m["action"], m["attempt_id"], m["node"]) for m in stops} == {("cancel", "j1-1", job["tpu"])}
    assert all("job" not in m for m in stops)

    sched.deliver("attempt-events", ended("cancelled"))
    job = sched.job("j1")
    assert job["state"] == "cancelled" and job["reason"] == "wrong data"
    assert sched.tpu("n1")["state"] == "idle"


def test_cancel_assigned_job_before_it_started(sched):
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train"})
    sched.deliver("fleet-events", active("n1"))
    sched.drain("assignments")
    sched.deliver("cancels", CancelRequest(job_id="j1"))
    assert {m["action"] for m in sched.drain("assignments")} == {"cancel"}
    sched.deliver("attempt-events", ended("cancelled"))
    assert sched.job("j1")["state"] == "cancelled"


def test_cancel_finished_job_changes_nothing(sched):
    running_job(sched)
    sched.deliver("attempt-events", ended("succeeded"))
    before = sched.job("j1")
    sched.drain("capacity")
    sched.deliver("cancels", CancelRequest(job_id="j1"))
    assert sched.job("j1") == before
    assert sched.drain("assignments") == [] and sched.drain("capacity") == []


def test_cancel_of_an_unknown_job_is_recorded_not_retried(sched):
    sched.deliver("cancels", CancelRequest(job_id="nope"))
    [dead] = sched.all(store.DEAD_LETTERS).values()
    assert dead["field"] == "job_id" and "nope" in dead["reason"]


# `tpuq cancel --if-pending`: every message below is delivered twice (a redelivery), as `deliver` always does.

def test_cancel_if_pending_cancels_a_job_that_has_not_started(sched):
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train"})
    sched.deliver("cancels", CancelRequest(job_id="j1", if_pending=True, expected_attempt=0))
    assert sched.job("j1")["state"] == "cancelled"


def test_cancel_if_pending_leaves_a_started_job_alone(sched):
    running_job(sched)
    before = sched.job("j1")
    sched.deliver("cancels", CancelRequest(job_id="j1", if_pending=True, expected_attempt=0))
    assert sched.job("j1") == before and not before.get("cancel_requested")
    assert sched.drain("assignments") == []  # nothing is stopped


def test_cancel_if_pending_leaves_a_job_that_ran_and_was_requeued_since(sched):
    running_job(sched)  # the CLI read it at 0 attempts; then it ran, and was preempted back to pending
    sched.deliver("attempt-events", ended("preempted"))
    requeued = sched.job("j1")
    assert requeued["state"] == "pending" and requeued["attempt"] == 1
    sched.deliver("cancels", CancelRequest(job_id="j1", if_pending=True, expected_attempt=0))
    assert sched.job("j1")["state"] == "pending"
    sched.deliver("cancels", CancelRequest(job_id="j1", if_pending=True, expected_attempt=1))
    assert sched.job("j1")["state"] == "cancelled"


def test_set_priority_reorders_the_queue_for_the_next_pass(sched):
    """What `tpuq set-priority` writes (`jobstate.reprioritized`), then its tick: the low job submitted first,
    raised to high, gets the one idle TPU ahead of the normal one."""
    from datetime import datetime, timezone

    from tpuq.contracts.jobspec import Priority
    from tpuq.contracts.jobstate import reprioritized
    from tpuq.contracts.messages import Tick

    sched.deliver("jobs", {"id": "ja", "tpu": "v4-8", "priority": "low", "command": "train"})
    sched.deliver("jobs", {"id": "jb", "tpu": "v4-8", "command": "train"})
    fields = reprioritized(sched.job("ja"), Priority.high, datetime.now(timezone.utc))
    sched.db.collection(store.JOBS).document("ja").update(fields)
    assert reprioritized(sched.job("ja"), Priority.high, datetime.now(timezone.utc)) is None  # a repeat: no write
    sched.deliver("ticks", Tick(at=datetime.now(timezone.utc), source="set-priority"))
    sched.deliver("fleet-events", active("n1"))
    assert (sched.job("ja")["state"], sched.job("jb")["state"]) == ("assigned", "pending")
