"""The quickstart's claim rules, on the claim stack (claimer + janitor, the Firestore emulator, the fake Cloud TPU
on a manual clock); the fake's call log is the witness of every create and delete.

Ticks come every 60 scenario seconds, the janitor's before the claimer's: the order that used to let the
janitor delete a FAILED request before the claimer had read why it failed.
"""

from __future__ import annotations

import pytest

from tests.integration.claimstack import PROJECT, ClaimStack
from tpuq.contracts.documents import QR_STATES_RACING
from tpuq.contracts.messages import AttemptEvent, AttemptEventKind, AttemptOutcome, CapacityAction, FleetEventKind, Tick

A, B, C, D = "us-central2-a", "us-central2-b", "us-central2-c", "us-central2-d"
TICK = 60.0
ACTIVE_AFTER = 1 + 5 + 600  # accepted + waiting + provisioning, in a zone with capacity
FAMILIES = {"v4-32": "v4", "v6e-8": "v6e"}


def scenario(zones: dict[str, list[dict]], families=("v4",), waiting: float = 5) -> dict:
    """zone -> its stockout windows; every zone has quota for `families`."""
    return {"zones": {z: {"quota": {f: {"spot": 256} for f in families}, "stockouts": windows}
                      for z, windows in zones.items()},
            "delays": {"accepted": 1, "waiting": waiting, "provisioning": 600, "deleting": 5}}


def fleet(entries: list[dict], quota_zones, families=("v4",), **claim) -> dict:
    return {"name": "claims", "project": PROJECT, "owner_prefix": "tq",
            "claim": {"watch_interval_seconds": 3, **claim},
            "quota": {z: {f: {"spot": 256} for f in families} for z in quota_zones},
            "tpus": entries}


@pytest.fixture
def claim_stack(clients, tmp_path):
    stacks: list[ClaimStack] = []

    def start(scenario_data: dict, fleet_data: dict, **kw) -> ClaimStack:
        s = ClaimStack(clients.firestore, scenario_data, fleet_data, tmp_path / f"fake{len(stacks)}", **kw)
        stacks.append(s)
        return s

    yield start
    for s in stacks:
        s.close()


def ticks_until(s: ClaimStack, until: float) -> None:
    while s.scenario_time + TICK <= until:
        s.tick(TICK)


# ------------------------------------------------------------------ §1 FAILED: classified, then deleted


def test_a_failed_request_is_classified_backed_off_and_only_then_deleted(claim_stack):
    # The stockout fails the request 31 s after its create: after the claimer's quick re-reads, between ticks.
    s = claim_stack(scenario({A: [], B: [{"start": 0, "effect": "fail"}]}, waiting=30),
                    fleet([{"id": "v4", "type": "v4-32", "zones": [A, B], "count": 4}], [A, B],
                          capacity_backoff_base_seconds=3600))
    s.request("r1", count=4)  # demand throughout: four slices wanted, the stocked-out zone never has one
    ticks_until(s, 900)
    # One create in the stocked-out zone: its failure was read, the zone backed off 1800-3600 s, and nothing
    # created there again (it used to be one create per tick: ...-b, ...-b-1, ...-b-2, ...).
    assert s.created_ids(B) == [f"tq-r1-{B}"]
    doc = s.qr_doc(f"tq-r1-{B}")
    assert doc["failure_class"] == "capacity" and "no more capacity" in doc["failure_message"]
    [failed] = [e for e in s.events if e.zone == B and e.kind is FleetEventKind.failed]
    assert failed.failure_class.value == "capacity"
    assert not [e for e in s.events if e.zone == B and e.kind is FleetEventKind.gone and e.failure_class is None
                and not any(f.queued_resource == e.queued_resource for f in s.events
                            if f.kind is FleetEventKind.failed)]
    # Deleted after it was classified, once, and gone now.
    [delete] = [c for c in s.calls("DELETE", B)]
    first_failed_seen = failed.at
    assert delete["scenario_time"] >= (first_failed_seen - s.clock.wall(0)).total_seconds()
    assert s.state(f"tq-r1-{B}", B) is None
    # The healthy zone raced on meanwhile.
    assert s.created_ids(A)[:1] == [f"tq-r1-{A}"]


def test_a_preempted_slice_is_deleted_within_the_attempt_event_and_by_nobody_else(claim_stack):
    s = claim_stack(scenario({A: []}), fleet([{"id": "v4", "type": "v4-32", "zones": [A], "count": 1}], [A]))
    s.request("r1")
    ticks_until(s, ACTIVE_AFTER + TICK)
    [active] = [e for e in s.events if e.kind is FleetEventKind.active]
    s.record_tpu(active, "busy", "j1")
    s.control.preempt(active.node)
    s.clock.advance(31)  # SUSPENDING -> SUSPENDED
    # The claimer's watch sees it SUSPENDED first: it announces it and deletes nothing (the janitor owns it).
    s.post_twice(s.claimer, "/push/ticks", "claimer-ticks", Tick(seq=99))
    assert s.calls("DELETE") == []
    assert s.qr_doc(f"tq-r1-{A}")["state"] == "SUSPENDED"
    event = AttemptEvent(kind=AttemptEventKind.ended, job_id="j1", attempt=1, attempt_id="j1-1", node=active.node,
                         outcome=AttemptOutcome.preempted, at=s.now())
    s.post_twice(s.janitor, "/push/attempt-events", "janitor-attempt-events", event)
    assert s.deleted_ids() == [f"tq-r1-{A}"]  # within the attempt event, as before
    s.route()  # the SUSPENDED announcement reaches the janitor: done already, nothing more
    ticks_until(s, s.scenario_time + 3 * TICK)
    assert s.deleted_ids().count(f"tq-r1-{A}") == 1


# ------------------------------------------------------------------ §2 race every zone with quota


def test_count_one_races_every_zone_with_quota_once(claim_stack):
    offered = scenario({A: [], B: [], C: [], D: []})
    offered["zones"][D]["quota"] = {}  # D is offered, with no quota: Cloud Quotas says 0 there
    s = claim_stack(offered, fleet([{"id": "v4", "type": "v4-32", "zones": [A, B, C, D], "count": 1}], [A, B, C]))
    s.request("r1")
    s.request("r2")  # another job: the zones are taken by r1's racers, never two of one type in a zone
    assert sorted(s.created_ids()) == sorted(f"tq-r1-{z}" for z in (A, B, C))  # none in D, which has no quota


def test_the_first_winner_is_kept_and_the_losers_go_in_the_event_that_shows_they_lost(claim_stack):
    # A and B both get capacity at once; B provisions 300 s longer (still PROVISIONING when A wins); C never
    # gets capacity.
    data = scenario({A: [], B: [], C: [{"start": 0, "effect": "wait"}]})
    data["zones"][B]["provisioning"] = {"v4": 900}
    s = claim_stack(data, fleet([{"id": "v4", "type": "v4-32", "zones": [A, B, C], "count": 1}], [A, B, C]))

    def scheduler(event):  # the scheduler puts the job on the first slice it hears of
        if event.kind is FleetEventKind.active and event.zone == A:
            s.record_tpu(event, "busy", "r1")
    s.on_event = scheduler
    s.request("r1")
    assert len(s.creates()) == 3
    ticks_until(s, ACTIVE_AFTER + TICK)
    granted_at = min(e.at for e in s.events if e.kind is FleetEventKind.provisioning)
    won_at = next(e.at for e in s.events if e.kind is FleetEventKind.active)
    assert s.state(f"tq-r1-{B}", B) == "PROVISIONING"
    # C, still queued, was cancelled in the handling that saw capacity granted, before anything won; B cannot
    # be deleted while PROVISIONING.
    assert s.deleted_ids() == [f"tq-r1-{C}"]
    [cancel] = s.calls("DELETE", C)
    assert s.clock.wall(cancel["scenario_time"]) == granted_at < won_at
    ticks_until(s, 1 + 5 + 900 + TICK)  # B leaves PROVISIONING (ACTIVE at 906): deleted by the first tick after
    [gone] = s.calls("DELETE", B)
    assert 906 <= gone["scenario_time"] < 906 + TICK
    assert s.deleted_ids(A) == [] and s.state(f"tq-r1-{A}", A) == "ACTIVE"


def test_of_two_winning_in_the_same_instant_the_one_serving_the_job_stays(claim_stack):
    # The claimer's tick first: its watch pass sees both ACTIVE and announces both; the scheduler (standing in)
    # puts the job on the first it hears of and closes the request, as it does.
    s = claim_stack(scenario({A: [], B: []}),
                    fleet([{"id": "v4", "type": "v4-32", "zones": [A, B], "count": 1}], [A, B]), janitor_first=False)
    served = []

    def scheduler(event):  # as the scheduler does: the first ACTIVE serves the job and closes its request
        if event.kind is FleetEventKind.active and not served:
            served.append(event.zone)
            s.record_tpu(event, "busy", "r1")
            s.request("r1", action=CapacityAction.withdraw, route=False)
    s.on_event = scheduler
    s.request("r1")
    ticks_until(s, ACTIVE_AFTER + TICK)  # both turn ACTIVE between two ticks: one watch pass sees both
    assert sorted(e.zone for e in s.events if e.kind is FleetEventKind.active) == [A, B]
    [kept] = served
    other = B if kept == A else A
    assert s.deleted_ids() == [f"tq-r1-{other}"]
    assert s.state(f"tq-r1-{kept}", kept) == "ACTIVE"


# ------------------------------------------------------------------ §3 single-slot types


def test_single_slot_type_one_request_at_a_time_never_alongside_other_types(claim_stack):
    # v6e (single-slot by default) in three zones, the first stocked out; v4 in two zones.
    s = claim_stack(scenario({A: [{"family": "v6e", "start": 0, "effect": "fail"}], B: [], C: []},
                             families=("v4", "v6e")),
                    fleet([{"id": "v4", "type": "v4-32", "zones": [B, C], "count": 4},
                           {"id": "v6e", "type": "v6e-8", "zones": [A, B, C], "count": 4}], [A, B, C],
                          families=("v4", "v6e"), capacity_backoff_base_seconds=3600))
    v6e_racing = []

    def count_v6e_racing():
        v6e_racing.append(sum(1 for q in s.fake.world.queued_resources.values()
                              if q.accelerator.name == "v6e-8" and q.state.name in QR_STATES_RACING))
    s.request("r1", types=("v6e-8",))
    count_v6e_racing()
    s.request("r2", types=("v6e-8",))
    count_v6e_racing()
    s.request("r3", types=("v4-32", "v6e-8"))
    count_v6e_racing()
    while s.scenario_time < 500:
        s.tick(TICK)
        count_v6e_racing()
    assert max(v6e_racing) == 1
    # r1's one racer in A; after the stockout there, in B (never both at once); r2 waits for it.
    assert [i for i in s.created_ids() if not i.startswith("tq-r3-")] == [f"tq-r1-{A}", f"tq-r1-{B}"]
    # r3 races its v4 in both v4 zones, and no v6e alongside them.
    assert [i for i in s.created_ids() if i.startswith("tq-r3-")] == [f"tq-r3-{B}", f"tq-r3-{C}"]
    assert {q.accelerator.name for q in s.fake.world.queued_resources.values() if q.qr_id.startswith("tq-r3-")} \
        == {"v4-32"}
