"""A quiet claimer tick reads almost nothing (issue 34 §1): an idle fleet its tick mark alone whatever its history
(`tpuq.claimer.idlemark`: two empty queries more when it turns idle), a fleet with live slices and no open request
the open-request query and one query of what was written since (`tpuq.runtime.deltaread`), and what the tick exists to catch (a
slice's state or health changing) is still caught by the next tick. Reads are counted as Firestore bills them (the
in-memory store's `billed`)."""

from __future__ import annotations

from datetime import timedelta

from tpuq.claimer.model import GONE
from tpuq.claimer.statestore import StateWriter
from tpuq.contracts.documents import QrRecord, RequestRecord, TargetRecord
from tpuq.contracts.messages import CapacityAction, CapacityRequest, FleetEventKind, Tick
from tpuq.runtime.service import utcnow
from tpuq_dev.devstack.stack import wait_for

from .conftest import fleet_data, scenario_data

ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]
FLEET_DOCS = 1  # the tick's stream of fleets/: one document here
MARK = 1  # claimer_ticks/{fleet}
# + open requests, live queued resources: two queries answering none, one read each
FIRST_IDLE_READS = FLEET_DOCS + MARK + 2
# Marked idle, and remembered so by the instance (`TickMemory`): the one query for a mark saying busy (none: one
# read); neither the fleets nor their marks are read (before: the fleets and the mark; earlier, the two queries).
IDLE_READS = 1


def tick_reads(h, seq: int) -> int:
    db = h.clients.firestore
    before = db.billed.reads
    h.push("/push/ticks", Tick(seq=seq))
    return db.billed.reads - before


def new_events(h) -> list[FleetEventKind]:
    """The kinds of the fleet events published since the last call (the harness keeps them all)."""
    seen = getattr(h, "_seen_events", 0)
    events = h.pull_events()
    h._seen_events = len(events)
    return [e.kind for e in events[seen:]]


def add_history(h, n: int = 30) -> None:
    """What weeks of use leave behind: zone targets, withdrawn requests, queued resources long gone."""
    writer, now = StateWriter(h.clients.firestore), utcnow()
    for i in range(n):
        zone = f"us-central2-{chr(ord('a') + i % 3)}"
        writer.put_target(TargetRecord("race", f"{zone}{i}", "v4-32", capacity_failures=1,
                                       backoff_until=now - timedelta(days=1)))
        writer.put_request(RequestRecord(request_id=f"old-{i}", fleet="race", types=("v4-32",), regions=(),
                                         zones=(), count=1, status="withdrawn", job_ids=(), generations={},
                                         at=None, created_at=now, updated_at=now))
        writer.put_qr(QrRecord(qr_id=f"old-{i}", fleet="race", project="tpuq-test", request_id=f"old-{i}",
                               entry_id="v432", zone=zone, type="v4-32", spot=True, generation=0, state=GONE,
                               created_at=now, updated_at=now))


def test_an_idle_fleet_reads_its_mark_alone_whatever_its_history(claimer):
    h = claimer(scenario_data(ZONES))
    h.fleet(fleet_data(ZONES))
    add_history(h)
    # Before: every zone target, status, control; then (HEAD) the two empty queries on every tick.
    assert [tick_reads(h, seq) for seq in range(4)] == [FIRST_IDLE_READS] + [IDLE_READS] * 3
    assert h.creates() == [] and new_events(h) == []


def test_a_request_after_idle_is_watched_by_the_next_tick(claimer):
    """The mark turns busy with the capacity request (whatever instance handles it), so the tick after it watches
    the new slice and announces it ACTIVE; once nothing is open or live the ticks are back to the mark alone."""
    h = claimer(scenario_data(ZONES[:1], provisioning=1))
    h.fleet(fleet_data(ZONES[:1]))
    seq = iter(range(1000))
    assert [tick_reads(h, next(seq)) for _ in range(2)] == [FIRST_IDLE_READS, IDLE_READS]
    h.push("/push/capacity", CapacityRequest(request_id="job-1", fleet="race", types=["v4-32"], count=1))
    assert tick_reads(h, next(seq)) > IDLE_READS
    wait_for(lambda: h.push("/push/ticks", Tick(seq=next(seq))) is not None
             and FleetEventKind.active in new_events(h), what="the slice ACTIVE and announced")


def test_the_backstop_runs_the_queries_again_on_its_cadence(claimer, monkeypatch):
    """A mark left idle over an open request (a lost write) is caught on the backstop cadence: each instance runs
    the queries again every $TPUQ_BACKSTOP_SECONDS whatever the mark says."""
    from tpuq.claimer import idlemark

    h = claimer(scenario_data(ZONES[:1], provisioning=1), backstop_seconds=0.5)
    h.fleet(fleet_data(ZONES[:1]))
    seq = iter(range(1000))
    assert [tick_reads(h, next(seq)) for _ in range(2)] == [FIRST_IDLE_READS, IDLE_READS]
    monkeypatch.setattr(idlemark, "mark_busy", lambda *a, **k: None)  # the busy marks lost
    h.push("/push/capacity", CapacityRequest(request_id="job-1", fleet="race", types=["v4-32"], count=1))
    wait_for(lambda: h.push("/push/ticks", Tick(seq=next(seq))) is not None
             and FleetEventKind.active in new_events(h), what="the slice ACTIVE, seen by a backstop check")


def test_live_slices_cost_one_read_and_their_changes_are_still_caught(claimer, monkeypatch):
    """The live queued resources are read whole once, then only those written since the last tick
    (`tpuq.runtime.deltaread`): one read (an empty query) while nothing changes, however many are live."""
    from tpuq.runtime import deltaread

    # The history below is written a moment before the ticks, within the overlap every query reads again; a
    # deployment's history is older than it.
    monkeypatch.setattr(deltaread, "OVERLAP", timedelta(0))
    h = claimer(scenario_data(ZONES, provisioning=1))
    h.fleet(fleet_data(ZONES))
    add_history(h)
    h.push("/push/capacity", CapacityRequest(request_id="job-1", fleet="race", types=["v4-32"], count=3))
    seq = iter(range(1, 1000))
    wait_for(lambda: h.push("/push/ticks", Tick(seq=next(seq))) is not None
             and new_events(h).count(FleetEventKind.active) == 3, what="three slices ACTIVE and announced")
    # The scheduler no longer wants more: the request is withdrawn; the ACTIVE slices stay (the scheduler's).
    h.push("/push/capacity", CapacityRequest(request_id="job-1", fleet="race", types=["v4-32"], count=3,
                                             action=CapacityAction.withdraw))
    live, *others = [d for d in h.qr_docs() if d["live"]]
    assert len(others) == 2
    # Nothing changing: the empty open-request query and the empty query of queued resources written since the
    # last tick (before: the slice's own document, + 30 targets, ...).
    assert [tick_reads(h, next(seq)) for _ in range(3)] == [FLEET_DOCS + 1 + 1] * 3
    assert new_events(h) == []

    # Its health changes: the very next tick announces it (the whole state loaded for that tick only).
    h.control.set_health(live["node"], "UNHEALTHY_MAINTENANCE")
    h.push("/push/ticks", Tick(seq=next(seq)))
    assert new_events(h) == [FleetEventKind.node_health]
    assert tick_reads(h, next(seq)) == FLEET_DOCS + 1 + 1  # quiet again

    # Preempted: the next tick announces SUSPENDED.
    h.control.preempt(live["node"])
    wait_for(lambda: h.push("/push/ticks", Tick(seq=next(seq))) is not None
             and FleetEventKind.suspended in new_events(h), what="SUSPENDED announced by a tick")


def test_an_open_request_is_planned_on_every_tick(claimer):
    """A backed-off open request has no live queued resource: the tick still loads the targets and creates again
    once the back-off ends (the quiet path never stands in for planning)."""
    h = claimer(scenario_data(ZONES[:1], stocked_out=ZONES[:1]))
    h.fleet(fleet_data(ZONES[:1], claim={"watch_interval_seconds": 0.3, "capacity_backoff_base_seconds": 1,
                                         "capacity_backoff_max_seconds": 1}))
    h.push("/push/capacity", CapacityRequest(request_id="job-1", fleet="race", types=["v4-32"], count=1))
    seq = iter(range(1, 1000))
    wait_for(lambda: h.push("/push/ticks", Tick(seq=next(seq))) is not None and len(h.creates(ZONES[0])) >= 2,
             what="a second create after the back-off, made by a tick")



# ---------------------------------------------------------------- the pure decision (`tpuq.claimer.quiet`)

def _live_only(state):
    """What a tick reads first, with no open request: the live queued resources alone."""
    from tpuq.claimer.model import ClaimState

    return ClaimState(fleet=state.fleet, qrs=state.qrs)


def test_only_a_get_that_says_something_new_loads_the_whole_state():
    from dataclasses import replace

    from tpuq.claimer.model import ClaimState, Observation, Observed, RequestReceived
    from tpuq.claimer.quiet import tick_needs_full_state
    from tests.claimer.test_decide import NOW, make_fleet, request, run

    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    state, _ = run(state, Observed({q: Observation.found("WAITING_FOR_RESOURCES") for q in state.qrs}))
    live = _live_only(state)
    same = {q: Observation.found("WAITING_FOR_RESOURCES") for q in live.qrs}
    assert not tick_needs_full_state(live, same, NOW)
    assert not tick_needs_full_state(live, {q: Observation("unknown") for q in live.qrs}, NOW)
    assert not tick_needs_full_state(ClaimState(fleet=state.fleet), {}, NOW)  # idle
    assert tick_needs_full_state(state, same, NOW)  # an open request: always planned on the whole state
    first = next(iter(live.qrs))
    for news in (Observation.found("FAILED", error_code=8, error_message="no more capacity"),
                 Observation.found("SUSPENDED"), Observation("not_found"), Observation.found("PROVISIONING")):
        assert tick_needs_full_state(live, {**same, first: news}, NOW), news
    # A delete asked earlier and not yet taken is sent again: something to act on, though the state is the same.
    asked = replace(live, qrs={**live.qrs, first: replace(live.qrs[first], delete_requested=True)})
    assert tick_needs_full_state(asked, same, NOW)


def test_a_nudge_runs_the_queries_an_idle_mark_would_skip(claimer):
    """`tpuq fleet apply` / `resume` publish a nudge: the claimer looks at its fleet now, not at the cadence's next
    check of an idle mark."""
    h = claimer(scenario_data(ZONES))
    h.fleet(fleet_data(ZONES))
    tick_reads(h, 1)  # turns idle: marked
    assert tick_reads(h, 2) == IDLE_READS
    db = h.clients.firestore
    before = db.billed.reads
    h.push("/push/ticks", Tick(seq=3, source="fleet-apply", nudge=True))
    assert db.billed.reads - before - FLEET_DOCS > IDLE_READS  # the queries ran
