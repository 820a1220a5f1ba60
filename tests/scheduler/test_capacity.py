"""Capacity requests and withdrawals: one per waiting job attempt, capped by the fleet."""

from __future__ import annotations

import re

from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.jobspec import Priority
from tpuq.contracts.messages import CancelRequest, FailureClass, FleetEventKind, Tick
from tpuq.scheduler.capacity import ask_for_capacity, request_id_for, room_per_entry
from tpuq.scheduler.plan import PendingJob

from tests.scheduler.conftest import active, fleet_file, utc

NOW = utc(2026, 1, 1)


def job(job_id, **kw):
    return {"id": job_id, "tpu": "v4-8", "command": "train", **kw}


def summary(messages):
    return [(m.get("action", "request"), m["request_id"]) for m in messages]


# ---- pure ------------------------------------------------------------------


def test_request_ids_are_short_valid_and_distinct_per_attempt():
    assert request_id_for("j1", 1) == "r-j1-1"
    long_id = "a-very-long-job-name-that-goes-on-and-on-and-on-0123456789"
    ids = {request_id_for(long_id, n) for n in (1, 2)}
    assert len(ids) == 2
    for rid in ids | {request_id_for(long_id[:-1], 1)}:
        assert len(rid) <= 41 and re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", rid) and not rid.endswith("--")
    assert request_id_for(long_id, 1) != request_id_for(long_id[:-1] + "x", 1)


def test_requests_stop_at_the_room_left_and_say_why():
    fleet = fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 3, "chip_limit": 8}])
    room = room_per_entry(fleet, live_tpus={"v4": 1}, outstanding={})  # chip_limit 8 = 2 slices of 4 chips
    jobs = [(PendingJob(f"j{i}", Priority.normal, ("v4-8",), NOW), 0) for i in range(3)]
    jobs.append((PendingJob("v6", Priority.normal, ("v6e-8",), NOW), 0))
    asks, blocked = ask_for_capacity(jobs, fleet, room, NOW)
    assert [a.message.request_id for a in asks] == ["r-j0-1"]
    assert asks[0].entry_id == "v4" and asks[0].record["id"] == "r-j0-1"
    assert "max 2" in blocked["j1"] and "max 2" in blocked["j2"]
    assert blocked["v6"] == "no fleet entry offers v6e-8; fleet test offers v4-8 in us-central2-b"


def test_request_carries_zone_and_pinned_region():
    fleet = fleet_file()
    pinned = PendingJob("p", Priority.normal, ("v4-8",), NOW, pinned_region="us-central2")
    zoned = PendingJob("z", Priority.normal, ("v4-8",), NOW, zone="us-central2-b")
    asks, _ = ask_for_capacity([(pinned, 2), (zoned, 0)], fleet, room_per_entry(fleet, {}, {}), NOW)
    assert asks[0].message.request_id == "r-p-3" and asks[0].message.regions == ["us-central2"]
    assert asks[1].message.zones == ["us-central2-b"] and asks[1].message.job_ids == ["z"]


# ---- through the handlers ------------------------------------------------------


def test_waiting_job_asks_once(sched):
    sched.deliver("jobs", job("j1"))
    sched.deliver("ticks", Tick(seq=1))
    [req] = sched.drain("capacity")
    assert req["request_id"] == "r-j1-1" and req["fleet"] == "test" and req["types"] == ["v4-8"]
    assert req["count"] == 1 and req["job_ids"] == ["j1"] and req.get("action", "request") == "request"
    record = sched.job("j1")["capacity_request"]
    assert record["id"] == "r-j1-1" and record["entry_id"] == "v4"


def test_requests_are_capped_by_the_fleet(sched):
    save_fleet(sched.db, fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 2}]), NOW)
    sched.deliver("fleet-events", active("n1"))
    for name in ("a", "b", "c"):
        sched.deliver("jobs", job(name))
    sched.deliver("ticks", Tick(seq=1))
    assert sched.job("a")["state"] == "assigned"
    # n1 exists and b's request is open: the entry's 2 slices are spoken for.
    assert summary(sched.drain("capacity")) == [("request", "r-b-1")]
    assert "maximum" in sched.job("c")["blocked"] and sched.job("c").get("capacity_request") is None

    sched.deliver("fleet-events", active("n2", request_id="r-b-1"))  # the claimer served b's request
    assert sched.job("b")["state"] == "assigned" and sched.job("b")["capacity_request"] is None
    sched.deliver("ticks", Tick(seq=2))
    # Served: closed at the claimer (so an idle deletion of n2 later is not re-requested); still no room for c.
    # The ACTIVE event was delivered twice, and a withdraw is idempotent at the claimer: it may come twice.
    assert set(summary(sched.drain("capacity"))) == {("withdraw", "r-b-1")}
    assert sched.job("c")["state"] == "pending"


def test_job_matched_elsewhere_withdraws_its_request(sched):
    sched.deliver("jobs", job("j1"))
    sched.deliver("fleet-events", active("warm"))  # not from j1's request (a keep-warm TPU, say)
    assert sched.job("j1")["state"] == "assigned"
    assert summary(sched.drain("capacity")) == [("request", "r-j1-1"), ("withdraw", "r-j1-1")]


def test_served_request_taken_by_a_higher_priority_job_is_asked_again(sched):
    sched.deliver("jobs", job("low", priority="low"))
    sched.deliver("jobs", job("high", priority="high"))
    sched.deliver("fleet-events", active("n1", request_id="r-low-1"))
    assert sched.job("high")["state"] == "assigned" and sched.job("low")["state"] == "pending"
    assert list(dict.fromkeys(summary(sched.drain("capacity")))) == [
        ("request", "r-low-1"),
        ("request", "r-high-1"),
        ("withdraw", "r-low-1"),  # served by n1: closed at the claimer
        ("withdraw", "r-high-1"),  # high took n1: its own request is not needed
        ("request", "r-low-2"),
    ]
    assert sched.job("low")["capacity_request"]["id"] == "r-low-2"


def test_cancelling_a_waiting_job_withdraws_its_request(sched):
    sched.deliver("jobs", job("j1"))
    sched.deliver("cancels", CancelRequest(job_id="j1", reason="not needed"))
    j = sched.job("j1")
    assert j["state"] == "cancelled" and j["reason"] == "not needed" and j["capacity_request"] is None
    assert summary(sched.drain("capacity")) == [("request", "r-j1-1"), ("withdraw", "r-j1-1")]
    sched.deliver("fleet-events", active("n1"))
    assert sched.drain("assignments") == []


def test_failed_racer_is_shown_on_the_job_and_the_request_stays_open(sched):
    sched.deliver("jobs", job("j1"))
    failed = active("n1", request_id="r-j1-1", kind=FleetEventKind.failed).model_copy(
        update={"node": None, "failure_class": FailureClass.zone_quota, "failure_message": "no v4 quota in us-central2-b"})
    sched.deliver("fleet-events", failed)
    j = sched.job("j1")
    # One zone's racer failed; the claimer races on elsewhere: the job keeps its request and shows why it waits.
    assert j["capacity_request"]["id"] == "r-j1-1"
    assert j["blocked"] == "v4-8 in us-central2-b: no quota left there (`tpuq fleet` says what to do)"  # short
    sched.deliver("ticks", Tick(seq=1))
    assert summary(sched.drain("capacity")) == [("request", "r-j1-1")]  # no second, competing request