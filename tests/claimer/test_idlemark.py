"""The claimer's idle mark (`tpuq.claimer.idlemark`): when a tick may stop at one read, and a tick that marks the
fleet idle never overwrites a busy mark written after it read the mark."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpuq.claimer import idlemark
from tpuq_dev.inmemory import MemoryFirestore

NOW = datetime(2026, 1, 5, tzinfo=timezone.utc)
EVERY = timedelta(minutes=5)


def test_a_tick_stops_at_an_idle_mark_until_the_backstop_is_due():
    assert idlemark.tick_may_stop({"quiet": True, "at": NOW - timedelta(minutes=1)}, NOW, EVERY)
    assert not idlemark.tick_may_stop({"quiet": True, "at": NOW - timedelta(minutes=6)}, NOW, EVERY)  # backstop
    assert not idlemark.tick_may_stop({"quiet": False, "at": NOW}, NOW, EVERY)
    assert not idlemark.tick_may_stop(None, NOW, EVERY)  # never marked (a new deployment): run the queries


def test_only_an_instance_whose_last_tick_found_nothing_reads_the_mark_first():
    assert idlemark.read_mark_first(None) and idlemark.read_mark_first(idlemark.TickCheck(idle=True))
    assert not idlemark.read_mark_first(idlemark.TickCheck(idle=False))


def test_a_busy_mark_written_after_the_tick_read_the_mark_wins():
    db = MemoryFirestore(project="p")
    seen = idlemark.read_mark(db, "race")
    idlemark.mark_busy(db, "race", NOW)  # a capacity request opened meanwhile
    assert not idlemark.mark_idle(db, seen, NOW)
    assert idlemark.read_mark(db, "race").to_dict()["quiet"] is False
    fresh = idlemark.read_mark(db, "race")
    assert idlemark.mark_idle(db, fresh, NOW)
    assert idlemark.tick_may_stop(idlemark.read_mark(db, "race").to_dict(), NOW, EVERY)
