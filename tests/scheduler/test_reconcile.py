"""The tick's backstop for a lost `ended` event: the executor's record of the end is applied."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from tpuq.contracts import store, topology
from tpuq.contracts.messages import Tick
from tpuq.scheduler import handlers
from tpuq.runtime.service import Context

from tests.scheduler.conftest import active
from tests.scheduler.test_attempts import running_job


def tick_context(sched, later: timedelta) -> Context:
    """A tick handled `later` than now: the clock is passed in, as every handler's is."""
    return Context(
        clients=sched.clients, now=lambda: datetime.now(timezone.utc) + later, rng=random.Random(1),
        message_id="tick-1", attributes={}, publish_time=None,
        subscription=topology.subscription_by_path("scheduler", "/push/ticks"), service="scheduler",
        settings=sched.clients.settings,
    )


def test_recorded_end_is_applied_when_its_event_was_lost(sched):
    running_job(sched)
    # The executor recorded the end and published it; the event was dead-lettered on the way.
    sched.db.collection(store.EXECUTIONS).document("j1:1").set(
        {"job_id": "j1", "attempt": 1, "ended": True, "outcome": "succeeded", "detail": "all 1 workers exited 0"})

    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=10)))
    assert sched.job("j1")["state"] == "running"  # too soon: the event may still be on its way

    handlers.on_tick(Tick(seq=2), tick_context(sched, timedelta(minutes=5)))
    assert sched.job("j1")["state"] == "succeeded"
    assert sched.tpu("n1")["state"] == "idle"
    handlers.on_tick(Tick(seq=3), tick_context(sched, timedelta(minutes=6)))  # and only once
    assert sched.attempts("j1")["1"]["outcome"] == "succeeded"


def test_attempt_without_a_recorded_end_is_left_alone(sched):
    running_job(sched)
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    assert sched.job("j1")["state"] == "running"


def test_slice_whose_active_event_was_lost_is_recorded_and_used(sched):
    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.statestore import qr_to_doc
    from tpuq.contracts.messages import WorkerEndpoint

    now = datetime.now(timezone.utc)
    node = "projects/tpuq-local/locations/us-central2-b/nodes/tpuq-r-x-1-us-central2-b"
    # The claimer saw it ACTIVE and announced it; the event was dead-lettered on the way.
    record = QrRecord(qr_id="tpuq-r-x-1-us-central2-b", fleet="test", project="tpuq-local", request_id="r-x-1",
                      entry_id="v4", zone="us-central2-b", type="v4-8", spot=True, generation=0, state="ACTIVE",
                      created_at=now, updated_at=now, node=node,
                      endpoints=(WorkerEndpoint(worker_id=0, ip="127.0.9.1", port=22),))
    sched.db.collection(store.QUEUED_RESOURCES).document(record.qr_id).set(qr_to_doc(record))
    sched.deliver("jobs", {"id": "j9", "tpu": "v4-8", "command": "train"})
    assert sched.job("j9")["state"] == "pending"

    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=1)))
    assert sched.tpu("tpuq-r-x-1-us-central2-b")["state"] == "busy"
    assert sched.job("j9")["state"] == "assigned" and sched.job("j9")["tpu"] == node


def test_a_failing_backstop_never_stops_the_others_nor_the_pass(sched, monkeypatch):
    import pytest

    from tpuq.contracts.errors import Retryable

    running_job(sched)
    sched.db.collection(store.EXECUTIONS).document("j1:1").set(
        {"job_id": "j1", "attempt": 1, "ended": True, "outcome": "succeeded", "detail": "all 1 workers exited 0"})
    sched.deliver("jobs", {"id": "j2", "tpu": "v4-8", "command": "train"})

    def broken(ctx, **_):
        raise RuntimeError("queued_resources unreadable")

    monkeypatch.setattr(handlers, "active_slices_not_recorded", broken)
    with pytest.raises(Retryable, match="queued_resources unreadable"):  # the tick is redelivered for it
        handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    assert sched.job("j1")["state"] == "succeeded"  # the step after the broken one ran
    assert sched.job("j2")["state"] == "assigned"  # onto the TPU j1 freed


def test_a_slice_recorded_by_the_backstop_keeps_the_health_the_claimer_saw(sched):
    """The claimer announces a node's health only when it changes: a slice recorded from the claimer's record
    must carry it, or an unhealthy node would look healthy to the pass for ever."""
    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.statestore import qr_to_doc
    from tpuq.contracts.documents import NodeHealth
    from tpuq.contracts.messages import WorkerEndpoint

    now = datetime.now(timezone.utc)
    node = "projects/tpuq-local/locations/us-central2-b/nodes/tpuq-r-y-1-us-central2-b"
    sick = NodeHealth.from_api({"health": "UNHEALTHY_TENSORFLOW"})
    record = QrRecord(qr_id="tpuq-r-y-1-us-central2-b", fleet="test", project="tpuq-local", request_id="r-y-1",
                      entry_id="v4", zone="us-central2-b", type="v4-8", spot=True, generation=0, state="ACTIVE",
                      created_at=now, updated_at=now, node=node,
                      endpoints=(WorkerEndpoint(worker_id=0, ip="127.0.9.2", port=22),), node_health=sick)
    sched.db.collection(store.QUEUED_RESOURCES).document(record.qr_id).set(qr_to_doc(record))
    sched.deliver("jobs", {"id": "j8", "tpu": "v4-8", "command": "train"})

    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=1)))
    tpu = sched.tpu("tpuq-r-y-1-us-central2-b")
    assert tpu["state"] == "idle" and NodeHealth.from_doc(tpu) == sick
    assert sched.job("j8")["state"] == "pending"  # the unhealthy slice took no job


def _claimer_record(qr_id: str, state: str, updated_at: datetime) -> dict:
    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.statestore import qr_to_doc

    node = f"projects/tpuq-local/locations/us-central2-b/nodes/{qr_id}"
    return qr_to_doc(QrRecord(qr_id=qr_id, fleet="test", project="tpuq-local", request_id=f"r-{qr_id}",
                              entry_id="v4", zone="us-central2-b", type="v4-8", spot=True, generation=0, state=state,
                              created_at=updated_at, updated_at=updated_at, node=node))


def test_a_busy_slice_whose_loss_event_was_lost_is_gone_and_its_attempt_preempted_once(sched):
    running_job(sched)  # j1 runs on n1 (queued resource .../queuedResources/n1)
    # The claimer saw it SUSPENDED, the janitor deleted it and the claimer recorded it GONE; both events it
    # published were dead-lettered on the way to the scheduler.
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", "GONE", datetime.now(timezone.utc)))

    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=10)))
    assert sched.tpu("n1")["state"] == "busy"  # too soon: the event may still be on its way

    handlers.on_tick(Tick(seq=2), tick_context(sched, timedelta(minutes=5)))
    assert sched.tpu("n1")["state"] == "gone"
    job = sched.job("j1")
    assert job["state"] == "pending" and job["preemptions"] == 1
    assert sched.attempts("j1")["1"]["outcome"] == "preempted"
    handlers.on_tick(Tick(seq=3), tick_context(sched, timedelta(minutes=6)))  # and only once
    assert sched.job("j1")["preemptions"] == 1


def test_an_idle_slice_whose_suspended_event_was_lost_takes_no_job(sched):
    sched.deliver("fleet-events", active("n1"))
    assert sched.tpu("n1")["state"] == "idle"
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", "SUSPENDED", datetime.now(timezone.utc)))

    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    assert sched.tpu("n1")["state"] == "gone"
    sched.deliver("jobs", {"id": "j7", "tpu": "v4-8", "command": "train"})
    assert sched.job("j7")["state"] == "pending"  # not handed a slice that no longer exists


def test_a_slice_the_claimer_still_records_active_is_left_in_service(sched):
    sched.deliver("fleet-events", active("n1"))
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", "ACTIVE", datetime.now(timezone.utc) - timedelta(hours=1)))
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    assert sched.tpu("n1")["state"] == "idle"


def test_an_attempt_that_ended_before_its_slice_was_lost_keeps_its_recorded_end(sched):
    """Both events lost: the executor's `ended succeeded` and the slice's GONE. The recorded end is applied first,
    so the job is done, not requeued as preempted."""
    running_job(sched)
    sched.db.collection(store.EXECUTIONS).document("j1:1").set(
        {"job_id": "j1", "attempt": 1, "ended": True, "outcome": "succeeded", "detail": "all 1 workers exited 0"})
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", "GONE", datetime.now(timezone.utc)))
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    job = sched.job("j1")
    assert job["state"] == "succeeded" and job["preemptions"] == 0
    assert sched.tpu("n1")["state"] == "gone"  # and the slice is still recorded lost


def test_a_record_of_another_resource_under_the_same_id_ends_nothing(sched):
    sched.deliver("fleet-events", active("n1"))
    other = _claimer_record("n1", "GONE", datetime.now(timezone.utc) - timedelta(hours=1))
    other["name"] = "projects/tpuq-local/locations/us-central2-a/queuedResources/n1"  # another zone's
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(other)
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=5)))
    assert sched.tpu("n1")["state"] == "idle"


def test_a_slice_lost_after_its_attempt_recorded_success_leaves_the_job_succeeded(sched):
    """The executor recorded (and published) `ended succeeded`; the slice's SUSPENDED event arrives before that
    event. The attempt ends as it ended, not preempted; the TPU is gone; the late `ended` changes nothing."""
    from tests.scheduler.test_attempts import ended

    running_job(sched)
    sched.db.collection(store.EXECUTIONS).document("j1:1").set(
        {"job_id": "j1", "attempt": 1, "ended": True, "outcome": "succeeded", "detail": "all 1 workers exited 0"})
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", "SUSPENDED", datetime.now(timezone.utc) - timedelta(hours=1)))
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=10)))  # the job changed just now
    job = sched.job("j1")
    assert job["state"] == "succeeded" and job["preemptions"] == 0
    assert sched.attempts("j1")["1"]["outcome"] == "succeeded"
    assert sched.tpu("n1")["state"] == "gone"
    sched.deliver("attempt-events", ended("succeeded"))
    assert sched.job("j1")["state"] == "succeeded" and sched.job("j1")["preemptions"] == 0
