"""Each service's `tick_due/` document says when its tick next has work (`tpuq.runtime.tickdue`), written with every
change of what decides it, so that the janitor routes the minute's tick to it then and only then."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpuq.contracts.documents import TpuState
from tpuq.executor.tickstate import JUDGE_AT, SWEEP_AT, TickDue
from tpuq.runtime import guarded, tickdue
from tpuq.runtime.cadence import EARLY_SHARE
from tpuq.scheduler.backstops import Backstop, claimed
from tpuq.scheduler.passdue import FOLLOWUP_DUE_FIELD, PASS_DUE_FIELD, lower_dues, state_ref, tick_due_at
from tpuq_dev.inmemory.firestore import MemoryFirestore

NOW = datetime(2026, 12, 5, 12, tzinfo=timezone.utc)
EVERY = timedelta(minutes=15)
NEXT_TURN = NOW + EVERY * (1 - EARLY_SHARE)


def test_the_schedulers_tick_is_due_at_its_earliest_backstop_pass_or_follow_up():
    assert tick_due_at({}, NOW, EVERY) == tickdue.ALWAYS  # nothing run yet: every backstop is due
    ran = {**claimed(list(Backstop), NOW), FOLLOWUP_DUE_FIELD: None}
    assert tick_due_at(ran, NOW, EVERY) == NEXT_TURN
    soon = NOW + timedelta(minutes=2)
    assert tick_due_at({**ran, PASS_DUE_FIELD: soon}, NOW, EVERY) == soon  # a back-off ending
    assert tick_due_at({**ran, FOLLOWUP_DUE_FIELD: soon}, NOW, EVERY) == soon  # an assignment to follow up
    assert tick_due_at({k: v for k, v in ran.items() if k != FOLLOWUP_DUE_FIELD}, NOW, EVERY) == tickdue.ALWAYS


def test_a_pass_that_lowers_a_due_lowers_the_schedulers_tick_due_in_the_same_write():
    db = MemoryFirestore(project="p")
    state_ref(db).set({**claimed(list(Backstop), NOW), FOLLOWUP_DUE_FIELD: None, tickdue.DUE_AT: NEXT_TURN})
    soon = NOW + timedelta(minutes=3)
    lower_dues(db, {PASS_DUE_FIELD: soon}, NOW, EVERY)
    doc = state_ref(db).get().to_dict()
    assert doc[PASS_DUE_FIELD] == soon and doc[tickdue.DUE_AT] == soon


def test_the_executors_tick_is_due_at_a_deferred_judgement_or_its_sweep_and_every_tick_while_probing():
    swept = {SWEEP_AT: NOW}
    assert TickDue(EVERY).at({}, NOW) == tickdue.ALWAYS  # never swept
    assert TickDue(EVERY).at(swept, NOW) == NEXT_TURN
    soon = NOW + timedelta(seconds=40)
    assert TickDue(EVERY).at({**swept, JUDGE_AT: soon}, NOW) == soon
    assert TickDue(EVERY, probing=True).at(swept, NOW) == tickdue.ALWAYS
    overdue = {SWEEP_AT: NOW - 2 * EVERY, JUDGE_AT: soon}  # a judgement deferred while the sweep waits its tick
    assert TickDue(EVERY).at(overdue, NOW) == tickdue.ALWAYS


def test_a_commit_that_makes_a_tpu_idle_or_deleting_gives_the_janitor_work_whoever_writes_it():
    db = MemoryFirestore(project="p")
    janitor = tickdue.ref(db, tickdue.JANITOR)
    janitor.set({tickdue.DUE_AT: NOW + timedelta(minutes=9)})
    tpu = db.collection("tpus").document("n1")
    assert guarded.commit_if_unchanged(db, guarded.WriteSet().update(tpu.get(), {"state": TpuState.busy}))
    assert janitor.get().to_dict()[tickdue.DUE_AT] == NOW + timedelta(minutes=9)
    for state in (TpuState.idle, TpuState.deleting):
        janitor.set({tickdue.DUE_AT: NOW + timedelta(minutes=9)})
        assert guarded.commit_if_unchanged(db, guarded.WriteSet().update(tpu.get(), {"state": state}))
        assert janitor.get().to_dict()[tickdue.DUE_AT] == tickdue.ALWAYS, state
    assert not tickdue.wakes_janitor("tpus/n1/history/1", {"state": "idle"})  # not a TPU's own document
    assert not tickdue.wakes_janitor("jobs/j1", {"state": "idle"})
