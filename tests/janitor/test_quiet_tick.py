"""A quiet janitor tick reads a small constant per fleet (issue 34 §1), and what the tick exists to catch is
still caught: an idle TPU past its timeout at once, a lost fleet event (a surplus racer that turned ACTIVE)
within the full sweep's cadence (`tpuq.janitor.cadence`) and a tick."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from tpuq.contracts.messages import Tick
from tpuq.janitor import handlers

from tests.janitor.conftest import ACTIVE_AFTER, THIRD_ZONE, WIN_ZONE

SWEEP_EVERY = timedelta(minutes=5)
# The router's query for the services whose tick has work (`tpuq.runtime.tickdue`; none: one read), the janitor's
# own among them (`tick_due/janitor`: due while a TPU is idle or deleting, else at its next run on a cadence). A
# tick whose own work is due reads that document (in the query's answer, or alone on an instance's first tick),
# then fleets/, fleet_control/{fleet}, janitor/{fleet} and the fleet's TPUs idle or deleting (each one found is
# one more: a constant per live slice).
ROUTER_READS = 1
QUIET_TICK_READS = ROUTER_READS
FLEET_TICK_READS = 1 + 4


class Ticker:
    """Ticks handled in process, on a clock the test moves with the fake's (the janitor's cadence is counted in
    it); the full sweep on its production cadence."""

    def __init__(self, s):
        self.s, self.now = s, datetime.now(timezone.utc)
        self.published: list[tuple[str, object]] = []  # the ticks routed to the other services
        self.ctx = SimpleNamespace(clients=SimpleNamespace(firestore=s.db, tpu=s.tpu), now=lambda: self.now,
                                   publish=lambda topic, message, **_: self.published.append((topic, message)),
                                   state=handlers.JanitorState(orphan_scan_seconds=3600, sweep_every=SWEEP_EVERY))
        handlers.on_tick(Tick(), self.ctx)  # the instance's first tick: routed to every service, read nothing

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.s.advance(seconds)

    def tick(self) -> int:
        """One tick; the Firestore reads it was billed."""
        before = self.s.db.billed.reads
        handlers.on_tick(Tick(), self.ctx)
        return self.s.db.billed.reads - before


def test_a_quiet_tick_reads_a_constant_whatever_the_fleet_holds(janitor_stack):
    s = janitor_stack
    t = Ticker(s)
    names = []
    for i in range(4):  # four busy slices, each with its request and a gone TPU of the past
        s.record_request(f"r{i}", count=1)
        names.append(s.create_owned(f"r{i}", WIN_ZONE))
    t.advance(ACTIVE_AFTER + 1)
    for name in names:
        s.record_tpu(name, state="busy")
    for i in range(20):
        s.db.collection("tpus").document(f"old{i}").set({"fleet": s.fleet.name, "state": "gone"})
    assert t.tick() > QUIET_TICK_READS  # the first tick: the full sweep, due (never run)
    for _ in range(3):
        t.advance(60)
        assert t.tick() == QUIET_TICK_READS
    assert s.deletes() == []


def _one_busy_slice(s, t: Ticker) -> tuple[str, str]:
    """A slice won and running a job, the full sweep run: its node name and its `tpus/` id."""
    s.record_request("r1", count=1)
    winner = s.create_owned("r1", WIN_ZONE)
    t.advance(ACTIVE_AFTER + 1)
    tpu_id = s.record_tpu(winner, state="busy")
    t.tick()  # the full sweep: nothing to do
    return winner, tpu_id


def test_an_idle_tpu_past_its_timeout_goes_on_a_quiet_tick(janitor_stack):
    s = janitor_stack
    t = Ticker(s)
    winner, tpu_id = _one_busy_slice(s, t)
    s.write_tpu(tpu_id, {"state": "idle", "idle_since": t.now - timedelta(days=1)})
    t.advance(60)
    t.tick()  # a quiet tick: the idle rule still applies at once
    assert s.deleted_ids() == [winner.rsplit("/", 1)[-1]]
    assert s.tpu_doc(tpu_id)["state"] in ("deleting", "gone")


def test_a_lost_fleet_event_is_caught_within_the_sweep_cadence_and_a_tick(janitor_stack):
    s = janitor_stack
    t = Ticker(s)
    s.record_request("r2", count=1)
    winner = s.create_owned("r2", WIN_ZONE)
    t.advance(300)
    late = s.create_owned("r2", THIRD_ZONE)
    t.advance(ACTIVE_AFTER - 300 + 1)
    s.record_tpu(winner, state="busy")
    t.tick()  # the full sweep, due: the late racer is PROVISIONING, left alone
    assert s.deletes() == []
    t.advance(300)  # it turns ACTIVE, a surplus racer; its ACTIVE event is lost (never delivered)
    waited = 0
    while not s.deletes():
        assert waited <= (SWEEP_EVERY + timedelta(minutes=1)).total_seconds(), "not caught within the bound"
        t.advance(60)
        waited += 60
        t.tick()
    assert s.deleted_ids() == [late.rsplit("/", 1)[-1]]


def test_the_sweep_cadence_and_when_the_idle_rule_needs_every_live_tpu():
    from tpuq.janitor import cadence
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert cadence.sweep_due(None, now, SWEEP_EVERY)  # never run
    assert not cadence.sweep_due(now - timedelta(minutes=4), now, SWEEP_EVERY)
    assert cadence.sweep_due(now - timedelta(minutes=5), now, SWEEP_EVERY)  # every fifth tick, not sixth
    assert cadence.sweep_due(now + timedelta(minutes=6), now, SWEEP_EVERY)  # recorded ahead: a clock set wrong
    healthy, quarantined = SimpleNamespace(quarantined=False, entry_id="e"), SimpleNamespace(quarantined=True,
                                                                                           entry_id="e")
    assert cadence.needs_every_live_tpu([healthy], lambda e: 1, paused=False)
    assert not cadence.needs_every_live_tpu([healthy], lambda e: 0, paused=False)
    assert not cadence.needs_every_live_tpu([healthy], lambda e: 1, paused=True)
    assert not cadence.needs_every_live_tpu([quarantined], lambda e: 1, paused=False)


def test_the_orphan_scan_reads_a_tpus_record_only_for_what_has_no_queued_resource_record(janitor_stack):
    """Every listed resource the claimer recorded is known by its `queued_resources/` record: the scan reads
    that one document each (HEAD read its `tpus/` record too: two reads a listed resource, every scan)."""
    s = janitor_stack
    t = Ticker(s)
    for i in range(4):
        s.record_request(f"r{i}", count=1)
        s.create_owned(f"r{i}", WIN_ZONE)
    janitor = handlers.janitor_for(t.ctx, s.fleet)
    listed, _ = janitor.list_fleet_zones()
    before = s.db.billed.reads
    known = janitor.known_among(listed)
    assert len(known) == 4 and s.db.billed.reads - before == 4


def test_a_pause_nudge_deletes_an_idle_tpu_at_once(janitor_stack):
    """`tpuq fleet pause` says idle TPUs are deleted now: its nudge runs the sweep a quiet tick leaves to the
    cadence."""
    from tpuq.runtime.fleetstore import set_paused

    s = janitor_stack
    t = Ticker(s)
    winner, tpu_id = _one_busy_slice(s, t)
    s.write_tpu(tpu_id, {"state": "idle", "idle_since": t.now})  # just now: within
    t.advance(60)                                                                            # its idle timeout
    set_paused(s.db, s.fleet.name, True, t.now, "someone")
    before = s.db.billed.reads
    handlers.on_tick(Tick(source="pause", nudge=True), t.ctx)
    assert s.db.billed.reads - before > QUIET_TICK_READS
    assert s.deleted_ids() == [winner.rsplit("/", 1)[-1]]


def test_a_fresh_instance_a_due_run_and_a_lost_drain_nudge_read_every_fleet(janitor_stack):
    """A new instance's first tick reads every fleet; so does the tick at which a run on a cadence is due; and a
    drain asked for is done by the next tick even when its nudge is lost (the request marks the janitor's work
    due, `tpuq.runtime.fleetstore`)."""
    from tpuq.runtime.fleetstore import request_drain

    s = janitor_stack
    t = Ticker(s)
    _one_busy_slice(s, t)
    t.advance(60)
    assert t.tick() == QUIET_TICK_READS
    t.ctx.state = handlers.JanitorState(orphan_scan_seconds=3600, sweep_every=SWEEP_EVERY)  # a new instance
    assert t.tick() == FLEET_TICK_READS  # its first tick goes to every service, unread, and reads every fleet
    assert t.tick() == QUIET_TICK_READS
    t.advance(SWEEP_EVERY.total_seconds())
    assert t.tick() > FLEET_TICK_READS  # the full sweep, due: every live TPU read
    assert t.tick() == QUIET_TICK_READS
    request_drain(s.db, s.fleet.name, "d1", t.now, "someone")
    t.advance(60)
    assert t.tick() > FLEET_TICK_READS  # no nudge came: the drain is read and done all the same
    assert s.db.collection("fleet_control").document(s.fleet.name).get().to_dict().get("drain_done_id") == "d1"
