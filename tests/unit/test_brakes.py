"""The brakes' pure parts: the fleet settings, the day's VM-hours, the claimer's gate, the janitor's pause and
drain rules, and what `tpuq fleet` and a waiting job show."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from tests.janitor import factories as jf
from tpuq.capacity.brakes import DayUse, claim_stop_reason, day_use, grant_days_left
from tpuq.claimer.decide import claim_gate, decide_observed, decide_request_received
from tpuq.claimer.model import REQUESTED, ClaimState, Observation, Observed, QrRecord, RequestReceived
from tpuq.contracts.documents import TpuDoc
from tpuq.contracts.fleet import Budget, FleetFile
from tpuq.operations.fleetreport import build_view, local_time, waiting_reason
from tpuq.runtime.fleetstore import FleetControl
from tpuq.janitor import decide as jd
from tpuq.contracts.messages import CapacityRequest

NOW = datetime(2026, 12, 1, 12, 30, tzinfo=timezone.utc)
ZONES = ["us-central2-a", "us-central2-b"]
PARIS = ZoneInfo("Europe/Paris")


def fleet(**over) -> FleetFile:
    data = {"name": "f1", "project": "p", "owner_prefix": "tq",
            "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 10}]}
    data.update(over)
    return FleetFile.model_validate(data)


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("over, line", [
    ({"budget": {"vm_hours_per_day": 0}}, "budget.vm_hours_per_day: Input should be greater than 0"),
    ({"budget": {"vm_hours": 5}}, "budget.vm_hours"),
    ({"grant_expires": "next month"}, "grant_expires: 'next month' is not a date like 2026-12-31"),
    ({"grant_expires": 30}, "grant_expires: 30 is not a date like 2026-12-31"),
])
def test_bad_brake_settings_are_one_line_naming_the_field(over, line):
    from tpuq.cli.console import CliError
    from tpuq.cli.files import validate_data

    data = fleet().model_dump(mode="json") | over
    with pytest.raises(CliError) as e:
        validate_data(data, "fleet")
    assert line in str(e.value) and "\n" not in str(e.value)


def test_brake_settings_round_trip_through_the_stored_fleet():
    f = fleet(budget={"vm_hours_per_day": 48}, grant_expires="2026-12-30")
    again = FleetFile.model_validate(f.model_dump(mode="json"))
    assert again == f and again.version == f.version and str(again.grant_expires) == "2026-12-30"


# ---------------------------------------------------------------- VM-hours


def tpu(created_h: float, gone_h: float | None = None, tpu_type: str = "v4-32", fleet_name: str = "f1") -> dict:
    """A tpus/ document created `created_h` hours before NOW (gone `gone_h` hours before NOW)."""
    doc = {"fleet": fleet_name, "type": tpu_type, "created_at": NOW - timedelta(hours=created_h), "state": "idle"}
    if gone_h is not None:
        doc |= {"state": "gone", "gone_at": NOW - timedelta(hours=gone_h)}
    return doc


@pytest.mark.parametrize("tpus, vm_hours, alive", [
    ([], 0, 0),
    ([tpu(2)], 8, 4),                         # 4 hosts for 2 h
    ([tpu(20)], 4 * 12.5, 4),                 # only since 00:00 UTC (12.5 h ago)
    ([tpu(3, gone_h=1)], 8, 0),               # gone: counts until it went
    ([tpu(30, gone_h=20)], 0, 0),             # gone yesterday
    ([tpu(1, tpu_type="v4-8")], 1, 1),        # 1 host
    ([tpu(2, fleet_name="other")], 0, 0),     # another fleet
])
def test_day_use_counts_hosts_times_hours_since_midnight_utc(tpus, vm_hours, alive):
    use = day_use(tpus, "f1", NOW)
    assert use == DayUse(pytest.approx(vm_hours), alive)


def test_grant_days_left_counts_its_last_day():
    assert grant_days_left(fleet(), NOW) is None
    assert grant_days_left(fleet(grant_expires="2026-12-01"), NOW) == 1
    assert grant_days_left(fleet(grant_expires="2026-12-31"), NOW) == 31
    assert grant_days_left(fleet(grant_expires="2026-11-30"), NOW) == 0


@pytest.mark.parametrize("over, paused, use, hosts, stopped", [
    ({}, False, DayUse(), 4, None),
    ({}, True, DayUse(), 4, "is paused"),
    ({"grant_expires": "2026-12-01"}, False, DayUse(), 4, None),           # its last day: still claims
    ({"grant_expires": "2026-11-30"}, False, DayUse(), 4, "grant ended on 2026-11-30"),
    ({"budget": {"vm_hours_per_day": 20}}, False, DayUse(10, 4), 4, None),  # 10 + (4 + 4) x 1 h = 18
    ({"budget": {"vm_hours_per_day": 20}}, False, DayUse(14, 4), 4, "over budget for today"),
])
def test_claim_stop_reason(over, paused, use, hosts, stopped):
    reason = claim_stop_reason(fleet(**over), paused, use, NOW, hosts)
    assert (reason is None) if stopped is None else (stopped in reason)


# ---------------------------------------------------------------- the claimer's gate


def capacity(rid="r1") -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="f1", types=["v4-32"], count=1)


@pytest.mark.parametrize("state_over, creates", [
    ({}, 2),
    ({"paused": True}, 0),
    ({"fleet": fleet(grant_expires="2026-11-30")}, 0),
    ({"fleet": fleet(budget={"vm_hours_per_day": 100}), "day_use": DayUse(80, 12)}, 2),   # 80 + 16 = 96
    ({"fleet": fleet(budget={"vm_hours_per_day": 100}), "day_use": DayUse(90, 12)}, 0),   # 90 + 16 = 106
])
def test_the_gate_stops_every_create_of_a_request(state_over, creates):
    state = replace(ClaimState(fleet()), **state_over)
    effects = decide_request_received(state, RequestReceived(capacity()), NOW, random.Random(1))
    assert len(effects.creates) == creates
    assert effects.requests  # the request is recorded either way: claiming goes on once the brake is off


def qr_record(rid: str, zone: str, state: str = "WAITING_FOR_RESOURCES") -> QrRecord:
    return QrRecord(qr_id=f"tq-{rid}-{zone}", fleet="f1", project="p", request_id=rid, entry_id="v4", zone=zone,
                    type="v4-32", spot=True, generation=0, state=state, created_at=NOW, updated_at=NOW)


def test_the_budget_counts_one_slice_for_every_other_request_still_racing():
    f = fleet(budget={"vm_hours_per_day": 10})
    racing = [qr_record("r0", z) for z in ZONES]  # one request racing in two zones: one slice of 4 hosts
    state = ClaimState(f, day_use=DayUse(1, 0))
    assert claim_gate(state, "r1", ("v4-32",), [], NOW) is None  # 1 + 4 <= 10
    assert claim_gate(state, "r1", ("v4-32",), racing, NOW) is None  # 1 + 8 <= 10
    assert "over budget" in claim_gate(state, "r1", ("v4-32",), racing + [qr_record("r2", ZONES[0])], NOW)


def test_a_paused_fleet_does_not_finish_a_recorded_create_but_still_watches():
    recorded = qr_record("r1", ZONES[0], state=REQUESTED)
    state = ClaimState(fleet(), paused=True, qrs={recorded.qr_id: recorded},
                       requests=decide_request_received(ClaimState(fleet()), RequestReceived(capacity()), NOW,
                                       random.Random(1)).requests)
    effects = decide_observed(state, Observed({recorded.qr_id: Observation("not_found")}), NOW, random.Random(1))
    assert effects.creates == []
    assert effects.qrs[recorded.qr_id].state == "GONE"


# ---------------------------------------------------------------- the janitor: pause and drain


def idle_tpu(tpu_id: str, idle_seconds: float) -> TpuDoc:
    return TpuDoc(id=tpu_id, fleet="f1", entry_id="v4pool", state="idle",
                  idle_since=NOW - timedelta(seconds=idle_seconds))


def test_paused_deletes_every_idle_tpu_at_once_keep_warm_aside():
    f = jf.fleet(idle=600, keep_warm=1)
    tpus = [idle_tpu("a", 5), idle_tpu("b", 700), TpuDoc(id="c", fleet="f1", entry_id="v4pool", state="busy",
                                                          idle_since=None)]
    assert [t.id for t in jd.decide_idle(tpus, f, NOW)] == ["b"]
    assert sorted(t.id for t in jd.decide_idle(tpus, f, NOW, paused=True)) == ["a", "b"]  # never the busy one


def test_drain_deletes_everything_owned_and_nothing_else():
    f = jf.fleet()
    ours = jf.ours(f)
    winner = jf.qr("tpuq-r1-a", "ACTIVE", labels=ours)
    winner_node = jf.node("tpuq-r1-a", "READY", labels=ours, queued_resource=winner.name)
    listed = [
        winner, winner_node,
        jf.qr("tpuq-r2-a", "WAITING_FOR_RESOURCES", labels=ours),
        jf.qr("tpuq-r3-a", "PROVISIONING", labels=ours),
        jf.qr("tpuq-r4-a", "DELETING", labels=ours),
        jf.node("tpuq-lone", "READY", labels=ours),                   # an owned node without a queued resource
        jf.node("user-tpu", "READY"),                                 # no marks
        jf.qr("tpuq-by-hand", "ACTIVE", labels={"team": "ml"}),       # our prefix, not our labels
        jf.node("other-node", "READY", labels=ours),                  # our labels, not our prefix
    ]
    decision = jd.decide_drain(listed, f)
    assert sorted(d.name.rsplit("/", 1)[-1] for d in decision.deletes) == ["tpuq-lone", "tpuq-r1-a", "tpuq-r2-a"]
    assert all(d.force for d in decision.deletes)
    assert [n.rsplit("/", 1)[-1] for n in decision.waiting] == ["tpuq-r3-a"] and not decision.done
    assert jd.decide_drain([jf.qr("tpuq-r4-a", "DELETING", labels=ours), jf.node("user-tpu", "READY")], f).done


# ---------------------------------------------------------------- what the user sees


def report(**over) -> dict:
    base = {"version": "v1", "blocked": None, "requests": [], "queued_resources": [], "backoffs": [], "dropped": []}
    return base | over


def test_local_time_shows_the_zone_and_the_day_when_not_today():
    assert local_time(datetime(2026, 12, 1, 13, 3, 29, tzinfo=timezone.utc), PARIS, NOW) == "14:03:29 CET"
    assert local_time(datetime(2026, 12, 2, 13, 3, tzinfo=timezone.utc), PARIS, NOW) == "Wed 02 Dec 14:03:00 CET"


def test_a_retry_back_off_shows_its_seconds_and_how_far_off_it_is():
    """Issue 35: `retry not before 17:34 UTC`, printed at 17:34:29, said nothing; now the seconds and `in 23s`."""
    from tpuq.operations.fleetreport import local_time_until

    at = datetime(2026, 12, 1, 17, 34, 29, tzinfo=timezone.utc)
    until = datetime(2026, 12, 1, 17, 34, 52, tzinfo=timezone.utc)
    assert local_time_until(until, timezone.utc, at) == "17:34:52 UTC (in 23s)"
    assert local_time_until(at, timezone.utc, until) == "17:34:29 UTC"  # past: no "in"
    almost = until - timedelta(milliseconds=400)
    assert local_time_until(until, timezone.utc, almost) == "17:34:52 UTC"  # under a second off: no "(in 0s)"
    job = {"state": "pending", "spec": {"tpu": ["v4-8"]}, "not_before": until}
    assert waiting_reason(job, [], at, timezone.utc) == "retry not before 17:34:52 UTC (in 23s)"


def test_view_per_zone_and_type_and_the_waiting_job():
    f = fleet(quota={"us-central2-a": {"v4": {"spot": 64}}, "europe-west4-a": {"v4": {"spot": 0}}},
              budget={"vm_hours_per_day": 50}, grant_expires="2026-12-10",
              tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-a", "us-central2-b", "europe-west4-a"]}])
    until = datetime(2026, 12, 1, 13, 3, tzinfo=timezone.utc)
    r = report(backoffs=[{"zone": "us-central2-a", "type": "v4-8", "until": until, "failures": 2,
                          "reason": "no more capacity"}],
               last_failures=[{"zone": "us-central2-a", "type": "v4-8", "class": "capacity",
                               "message": "no more capacity"}],
               queued_resources=[{"name": "projects/p/locations/us-central2-b/queuedResources/tq-r1-us-central2-b",
                                  "zone": "us-central2-b", "type": "v4-8", "state": "WAITING_FOR_RESOURCES"}])
    view = build_view(f, r, [tpu(2, tpu_type="v4-8")], FleetControl("f1"), NOW, PARIS)
    rows = {row["zone"]: row for row in view["targets"]}
    assert rows["us-central2-a"]["quota_chips"] == 64 and rows["us-central2-a"]["quota_source"] == "fleet file"
    assert rows["us-central2-a"]["backoff_until_local"] == "14:03:00 CET"
    assert rows["us-central2-a"]["backoff_until_shown"] == "14:03:00 CET (in 33m)"
    assert rows["us-central2-a"]["last_error"] == "no more capacity" and rows["us-central2-b"]["last_error"] is None
    assert rows["us-central2-b"]["racing"] == ["tq-r1-us-central2-b"] and rows["us-central2-b"]["quota_chips"] == 0
    assert "no quota: 0 chips" in rows["europe-west4-a"]["skipped"]
    assert view["brakes"]["budget"]["used_today"] == 2 and view["brakes"]["grant"]["days_left"] == 10
    assert view["brakes"]["claiming"] == "on"

    job = {"state": "pending", "spec": {"tpu": ["v4-8"]}}
    held = waiting_reason(job, [view], NOW, PARIS)
    assert held.startswith("racing v4-8 in us-central2-b; ")
    assert "v4-8 in us-central2-a backed off until 14:03:00 CET (in 33m)" in held and "europe-west4-a skipped" in held
    assert waiting_reason({**job, "spec": {"tpu": ["v4-8"], "zone": "us-central2-a"}}, [view], NOW, PARIS) == \
        "v4-8 in us-central2-a backed off until 14:03:00 CET (in 33m)"
    assert waiting_reason({**job, "state": "running"}, [view], NOW, PARIS) is None

    spent = build_view(f.model_copy(update={"budget": Budget(vm_hours_per_day=2.5)}), r, [tpu(2, tpu_type="v4-8")],
                       FleetControl("f1"), NOW, PARIS)
    assert "over budget for today" in spent["brakes"]["stopped"]  # 2 used + 1 h of the slice alive + 1 h of a new one
    assert "over budget" in waiting_reason(job, [spent], NOW, PARIS)

    paused = build_view(f, r, [], FleetControl("f1", paused=True), NOW, PARIS)
    assert paused["brakes"]["claiming"] == "stopped"
    assert "claiming stopped: fleet f1 is paused" in waiting_reason(job, [paused], NOW, PARIS)


@pytest.mark.parametrize("cancel_requested, state", [(False, "pending"), (True, "cancelled")])
def test_a_job_whose_cancel_was_asked_is_not_requeued_when_its_tpu_goes_first(cancel_requested, state):
    """A drain cancels the running jobs and deletes their TPUs: whichever the executor sees first, the job ends."""
    from tpuq.contracts.fleet import RetryBudgets
    from tpuq.contracts.messages import AttemptOutcome
    from tpuq.scheduler.lifecycle import attempt_ended

    job = {"id": "j1", "state": "running", "attempt": 1, "spec": {"tpu": ["v4-8"], "command": "x"},
           "cancel_requested": cancel_requested, "cancel_reason": "tpuq fleet drain --now"}
    end = attempt_ended(job, 1, AttemptOutcome.preempted, "node gone", RetryBudgets(), NOW, random.Random(1))
    assert end.job["state"] == state
    if cancel_requested:
        assert end.job["reason"] == "tpuq fleet drain --now"
