"""The tick's backstops for lost events run on a cadence recorded in Firestore (`tpuq.scheduler.backstops`), and
still catch each lost event within their bound (issue 34 §1): a quiet tick reads a few documents, not every live
slice and running job.

Each lost-event test puts the loss at the worst phase, just after the backstops ran, then ticks once a minute
and checks the event is caught by the bound and not at once (the cadence is at work)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts import store
from tpuq.contracts.messages import Tick
from tpuq.scheduler import handlers
from tpuq.runtime.settings import Settings
from tpuq.scheduler.backstops import Backstop, decide_backstops
from tpuq.scheduler.passdue import state_ref
from tpuq.scheduler.scheduling import RECONCILE_AFTER

from tests.scheduler.conftest import active
from tests.scheduler.test_attempts import running_job, started
from tests.scheduler.test_reconcile import _claimer_record, tick_context
from tests.scheduler.test_unstarted_assignments import EVERY as REPUBLISH_AFTER, assigned_job

TICK = timedelta(minutes=1)
EVERY = timedelta(minutes=5)  # the tests' backstop cadence (Settings.backstop_seconds; production: 15 minutes)
ENDED = {"job_id": "j1", "attempt": 1, "ended": True, "outcome": "succeeded", "detail": "all 1 workers exited 0"}


def test_every_backstop_is_due_at_first_then_once_a_period():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert decide_backstops(None, now, EVERY) == list(Backstop)
    ran = {b.field: now for b in Backstop}
    assert decide_backstops(ran, now + TICK, EVERY) == []
    assert decide_backstops(ran, now + EVERY - TICK, EVERY) == []
    assert decide_backstops(ran, now + EVERY - timedelta(seconds=2), EVERY) == list(Backstop)  # a tick a bit early
    assert decide_backstops(ran, now + timedelta(seconds=10), timedelta(seconds=10)) == list(Backstop)
    assert decide_backstops({**ran, Backstop.ended_attempts.field: now - EVERY}, now, EVERY) == \
        [Backstop.ended_attempts]
    assert decide_backstops({b.field: now + 2 * EVERY for b in Backstop}, now, EVERY) == list(Backstop)  # clock wrong


def _tick_at(sched, offset: timedelta, seq: int) -> None:
    handlers.on_tick(Tick(seq=seq), tick_context(sched, offset))


def _ticks_until(sched, start: timedelta, caught, limit: timedelta) -> timedelta:
    """Tick once a minute from `start` until `caught()`; the offset of the tick that caught it."""
    offset, seq = start, 100
    while offset <= limit + TICK:
        _tick_at(sched, offset, seq)
        if caught():
            return offset
        offset, seq = offset + TICK, seq + 1
    raise AssertionError(f"not caught by {limit}")


def test_a_lost_active_event_is_caught_within_the_cadence(sched):
    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.statestore import qr_to_doc
    from tpuq.contracts.messages import WorkerEndpoint

    _tick_at(sched, timedelta(0), 1)  # the backstops ran just now
    lost_at = timedelta(seconds=30)
    node = "projects/tpuq-local/locations/us-central2-b/nodes/tpuq-r-x-1-us-central2-b"
    now = datetime.now(timezone.utc) + lost_at
    record = QrRecord(qr_id="tpuq-r-x-1-us-central2-b", fleet="test", project="tpuq-local", request_id="r-x-1",
                      entry_id="v4", zone="us-central2-b", type="v4-8", spot=True, generation=0, state="ACTIVE",
                      created_at=now, updated_at=now, node=node,
                      endpoints=(WorkerEndpoint(worker_id=0, ip="127.0.9.1", port=22),))
    sched.db.collection(store.QUEUED_RESOURCES).document(record.qr_id).set(qr_to_doc(record))  # its event lost

    caught = _ticks_until(sched, timedelta(minutes=1), lambda: sched.tpu("tpuq-r-x-1-us-central2-b") is not None,
                          lost_at + EVERY + TICK)
    assert caught > timedelta(minutes=1)  # not by the next tick: the cadence, not every tick
    assert sched.tpu("tpuq-r-x-1-us-central2-b")["state"] == "idle"


def test_a_lost_ended_event_is_applied_within_its_bound(sched):
    running_job(sched)
    _tick_at(sched, timedelta(0), 1)
    lost_at = timedelta(seconds=30)
    sched.db.collection(store.EXECUTIONS).document("j1:1").set(ENDED)  # recorded; its event dead-lettered

    caught = _ticks_until(sched, timedelta(minutes=1), lambda: sched.job("j1")["state"] == "succeeded",
                          lost_at + RECONCILE_AFTER + EVERY + TICK)
    assert caught >= RECONCILE_AFTER
    assert sched.tpu("n1")["state"] == "idle" and sched.attempts("j1")["1"]["outcome"] == "succeeded"


@pytest.mark.parametrize("state", ["SUSPENDED", "GONE"])
def test_a_lost_slice_loss_is_applied_within_its_bound(sched, state):
    running_job(sched)
    _tick_at(sched, timedelta(0), 1)
    lost_at = timedelta(seconds=30)
    sched.db.collection(store.QUEUED_RESOURCES).document("n1").set(
        _claimer_record("n1", state, datetime.now(timezone.utc) + lost_at))  # its event lost

    caught = _ticks_until(sched, timedelta(minutes=1), lambda: sched.tpu("n1")["state"] == "gone",
                          lost_at + RECONCILE_AFTER + EVERY + TICK)
    assert caught >= lost_at + RECONCILE_AFTER
    job = sched.job("j1")
    assert job["state"] == "pending" and job["preemptions"] == 1


def test_an_assignment_never_started_is_sent_again_on_its_own_bound(sched):
    """The follow-up of unstarted assignments keeps its per-job bound (Settings.republish_assignment_after): it
    runs on every tick, whatever the other backstops' cadence."""
    assigned_job(sched)
    _tick_at(sched, timedelta(0), 1)  # the cadence's backstops claimed just now
    sent_at = _ticks_until(sched, timedelta(minutes=1), lambda: bool(sched.drain("assignments")),
                           REPUBLISH_AFTER + TICK)
    assert REPUBLISH_AFTER <= sent_at <= REPUBLISH_AFTER + TICK


def test_a_quiet_tick_reads_a_few_documents_however_many_slices_run(sched):
    """Between the backstops' runs a tick reads its state document, the late-assignment query and whether a job
    is pending: not every live slice and running job (on the code before the cadence: about 6 reads a slice)."""
    for n in range(8):
        sched.deliver("jobs", {"id": f"j{n}", "tpu": "v4-8", "command": "train"})
        sched.deliver("fleet-events", active(f"n{n}"))
        sched.deliver("attempt-events", started(job_id=f"j{n}", node=f"n{n}"))
    assert all(sched.job(f"j{n}")["state"] == "running" for n in range(8))
    _tick_at(sched, timedelta(minutes=3), 1)  # the backstops run (and find nothing lost)
    before = sched.db.billed.reads
    _tick_at(sched, timedelta(minutes=4), 2)
    assert sched.db.billed.reads - before <= 4


def test_two_instances_never_both_run_the_backstops(sched, monkeypatch):
    import tpuq.scheduler.handlers as h

    ran = []
    monkeypatch.setattr(h, "active_slices_not_recorded", lambda ctx, **_: ran.append(ctx.message_id) or [])
    _tick_at(sched, timedelta(minutes=1), 1)
    _tick_at(sched, timedelta(minutes=1, seconds=1), 1)  # another instance, the same tick a second later
    assert len(ran) == 1

    # And when the other instance claims between this one's read and its write, this one runs none.
    real = h.decide_backstops

    def claimed_meanwhile(state, now, every):
        due = real(state, now, every)
        state_ref(sched.db).set({b.field: now for b in Backstop})
        return due

    monkeypatch.setattr(h, "decide_backstops", claimed_meanwhile)
    _tick_at(sched, timedelta(minutes=1) + 2 * EVERY, 2)
    assert len(ran) == 1
