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
    assert not idlemark.mark_idle(db, seen, NOW, EVERY)
    assert idlemark.read_mark(db, "race").to_dict()["quiet"] is False
    fresh = idlemark.read_mark(db, "race")
    assert idlemark.mark_idle(db, fresh, NOW, EVERY)
    assert idlemark.tick_may_stop(idlemark.read_mark(db, "race").to_dict(), NOW, EVERY)


def test_the_mark_says_when_the_fleets_tick_next_has_work():
    """`due_at` (what routes the tick here, `tpuq.runtime.tickdue`): every tick while busy or while the fleet
    has `existing:` nodes to read; the backstop's turn while idle."""
    from tpuq.runtime import tickdue
    from tpuq.runtime.cadence import EARLY_SHARE

    db = MemoryFirestore(project="p")
    idlemark.mark_busy(db, "race", NOW)
    assert idlemark.read_mark(db, "race").to_dict()[tickdue.DUE_AT] == tickdue.ALWAYS
    assert idlemark.mark_idle(db, idlemark.read_mark(db, "race"), NOW, EVERY)
    assert idlemark.read_mark(db, "race").to_dict()[tickdue.DUE_AT] == NOW + EVERY * (1 - EARLY_SHARE)
    assert idlemark.mark_idle(db, idlemark.read_mark(db, "race"), NOW, EVERY, watch_always=True)
    assert idlemark.read_mark(db, "race").to_dict()[tickdue.DUE_AT] == tickdue.ALWAYS
