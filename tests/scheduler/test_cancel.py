"""Cancelling: a pending job at once, a running one through the executor, a finished one not at all."""

from __future__ import annotations

from tpuq import store
from tpuq.messages import CancelRequest

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
