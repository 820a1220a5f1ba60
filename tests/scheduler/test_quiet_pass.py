"""A tick runs the full scheduling pass only when time may change its answer or on the backstop cadence
(`tpuq.scheduler.passdue`, issue 34 §1): a quiet tick reads one document however long the queue, and a job
whose retry back-off ends between cadence runs is still planned at the first tick after it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc
from tpuq.contracts.messages import Tick
from tpuq.scheduler import handlers

from tests.scheduler.conftest import active
from tests.scheduler.test_long_queue import store_pending
from tests.scheduler.test_reconcile import tick_context

TICK = timedelta(minutes=1)


def _tick(sched, offset: timedelta, seq: int) -> int:
    """Handle a tick `offset` from now; the documents it read."""
    before = sched.db.billed.reads
    handlers.on_tick(Tick(seq=seq), tick_context(sched, offset))
    return sched.db.billed.reads - before


def test_an_idle_schedulers_tick_reads_one_document(sched):
    _tick(sched, timedelta(0), 1)  # the backstops run (and find nothing)
    # HEAD: the late-assignment query, the backstops' state and whether a job is pending: 3 reads a tick.
    assert [_tick(sched, n * TICK, n + 1) for n in (1, 2, 3)] == [1, 1, 1]


def test_a_long_queues_quiet_tick_does_not_read_the_queue_again(sched):
    store_pending(sched.db, 300, "v4-8", "high", "hi")  # more than the fleet's 4 slices will serve soon
    assert _tick(sched, timedelta(0), 1) > 64  # the backstops and the full pass run: the queue is read
    # HEAD ran the full pass on every tick with a job pending: the pending jobs read per type, every minute.
    assert max(_tick(sched, n * TICK, n + 1) for n in (1, 2, 3)) <= 1


def test_a_back_off_that_ends_between_cadence_runs_is_planned_at_the_next_tick(sched):
    _tick(sched, timedelta(0), 1)  # the cadence's runs claimed just now: the next is 5 minutes away
    ends = datetime.now(timezone.utc) + timedelta(seconds=90)
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train"})
    sched.db.collection(store.JOBS).document("j1").update({JobDoc.field("not_before"): ends})  # a retry back-off
    sched.deliver("fleet-events", active("n1"))  # its pass: the job backs off still; the back-off's end is kept
    assert sched.job("j1")["state"] == "pending"
    _tick(sched, TICK, 2)
    assert sched.job("j1")["state"] == "pending"  # 60 s: backing off still
    _tick(sched, 2 * TICK, 3)
    assert sched.job("j1")["state"] == "assigned"  # 120 s: the first tick after it, not the cadence's (300 s)


def test_a_nudge_runs_the_pass_a_quiet_tick_would_skip(sched):
    """`tpuq fleet apply`, `resume` and `set-priority` change what no event announces and publish a nudge: the job
    they free is planned at once, not at the cadence's next full pass (a fleet applied to unblock a job waited
    up to 5 minutes for it)."""
    sched.deliver("fleet-events", active("n1"))  # idle, nothing pending: its pass plans nothing
    _tick(sched, timedelta(0), 1)
    store_pending(sched.db, 1, "v4-8", "normal", "freed")  # as if the fleet change just made it runnable
    _tick(sched, TICK, 2)
    assert sched.job("freed-00000")["state"] == "pending"  # a quiet tick: nothing due
    handlers.on_tick(Tick(seq=3, source="fleet-apply", nudge=True), tick_context(sched, 2 * TICK))
    assert sched.job("freed-00000")["state"] == "assigned"
