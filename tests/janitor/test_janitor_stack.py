"""The janitor end to end through its entry point, on the in-memory store and the fake Cloud TPU API; the fake's
call log is the witness.

Every message is delivered twice (`post_twice`); the fixture checks at the end
that the foreign resources in every zone survived every pass.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts import store

from tests.janitor.conftest import ACTIVE_AFTER, THIRD_ZONE, WAIT_ZONE, WIN_ZONE, wait_until


def test_race_losers_are_deleted_while_handling_the_winners_active_event(janitor_stack):
    s = janitor_stack
    s.record_request("r1", count=1)
    winner = s.create_owned("r1", WIN_ZONE)
    waiting = s.create_owned("r1", WAIT_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    accepted = s.create_owned("r1", THIRD_ZONE)
    assert [s.state(n) for n in (winner, waiting, accepted)] == ["ACTIVE", "WAITING_FOR_RESOURCES", "ACCEPTED"]

    s.fleet_event("ACTIVE", winner, "r1")  # twice: the redelivery finds the losers gone

    assert sorted(s.deleted_ids()) == sorted(n.rsplit("/", 1)[-1] for n in (waiting, accepted))
    assert s.state(waiting) is None and s.state(accepted) is None
    assert s.state(winner) == "ACTIVE"


def test_provisioning_loser_is_left_alone_then_deleted_once_it_turns_active(janitor_stack):
    s = janitor_stack
    s.record_request("r2", count=1)
    winner = s.create_owned("r2", WIN_ZONE)
    s.advance(300)
    late = s.create_owned("r2", THIRD_ZONE)
    s.advance(ACTIVE_AFTER - 300 + 1)
    assert (s.state(winner), s.state(late)) == ("ACTIVE", "PROVISIONING")
    s.record_tpu(winner)  # the scheduler recorded the winner

    s.fleet_event("ACTIVE", winner, "r2")
    s.tick()
    assert s.deletes() == []  # never a delete while PROVISIONING (the API would refuse it)

    s.advance(300)  # the loser leaves PROVISIONING: ACTIVE, surplus, and no job is pending
    assert s.state(late) == "ACTIVE"
    s.tick()
    assert s.deleted_ids() == [late.rsplit("/", 1)[-1]]
    assert all(c["status"] < 300 for c in s.deletes())
    assert s.state(winner) == "ACTIVE" and s.tpu_doc(late.rsplit("/", 1)[-1])["state"] in ("deleting", "gone")


def test_late_winner_stays_while_a_job_is_pending(janitor_stack):
    s = janitor_stack
    s.record_request("r3", count=1)
    winner = s.create_owned("r3", WIN_ZONE)
    late = s.create_owned("r3", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    s.record_tpu(winner)
    s.db.collection("jobs").document("waiting-job").set({"id": "waiting-job", "state": "pending"})
    s.fleet_event("ACTIVE", late, "r3")
    assert s.deletes() == []


@pytest.mark.fleet(idle_timeout_seconds=2, entry={"keep_warm_count": 1})
def test_idle_tpu_is_deleted_after_the_timeout_and_keep_warm_keeps_one(janitor_stack):
    s = janitor_stack
    first = s.create_owned("r4", WIN_ZONE)
    second = s.create_owned("r5", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    start = datetime.now(timezone.utc)
    older = s.record_tpu(first, idle_since=start - timedelta(seconds=0.5))
    newer = s.record_tpu(second, idle_since=start)

    s.tick()
    assert s.deletes() == []  # not idle long enough yet
    wait_until(lambda: (s.tick(), s.deletes())[1], timeout=20, what="the idle TPU's delete")
    elapsed = (datetime.now(timezone.utc) - start).total_seconds()
    print(f"idle TPU deleted {elapsed:.2f} s after it became idle (timeout 2 s)")

    for _ in range(3):
        s.tick()
    assert s.deleted_ids() == [older]  # keep_warm_count 1: the most recently used one stays
    assert s.state(first) is None and s.state(second) == "ACTIVE"
    assert s.tpu_doc(older)["state"] == "gone" and s.tpu_doc(newer)["state"] == "idle"


@pytest.mark.fleet(idle_timeout_seconds=0)
def test_busy_tpu_is_never_deleted(janitor_stack):
    s = janitor_stack
    busy = s.create_owned("r6", WIN_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    tpu_id = s.record_tpu(busy, state="busy", idle_since=datetime.now(timezone.utc) - timedelta(hours=1))
    s.tick()
    assert s.deletes() == [] and s.tpu_doc(tpu_id)["state"] == "busy"


def test_assignment_that_commits_first_wins_over_the_idle_delete(janitor_stack):
    """The janitor's guard is a write conditioned on the document it decided from."""
    from tpuq.janitor.handlers import Janitor

    s = janitor_stack
    qr = s.create_owned("r7", WIN_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    tpu_id = s.record_tpu(qr, idle_since=datetime.now(timezone.utc) - timedelta(hours=1))

    def assigned_meanwhile(doc):
        # The scheduler's assignment commits between our read and our write.
        s.write_tpu(tpu_id, {"state": "busy", "job_id": "j9"})
        return True

    janitor = Janitor(ctx=None, fleet=s.fleet, api=None)  # mark_deleting only needs Firestore and a clock
    janitor.ctx = type("Ctx", (), {"now": staticmethod(lambda: datetime.now(timezone.utc)),
                                   "clients": type("C", (), {"firestore": s.db})})()
    assert janitor.mark_deleting(tpu_id, assigned_meanwhile, "idle") is False
    assert s.tpu_doc(tpu_id)["state"] == "busy"


def preempted_busy_tpu(s, request_id: str) -> tuple[str, str]:
    """An ACTIVE queued resource whose busy node was preempted: (queued resource, node), SUSPENDED."""
    qr = s.create_owned(request_id, WIN_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    s.record_tpu(qr, state="busy")
    node = qr.replace("/queuedResources/", "/nodes/")
    s.control.preempt(node)
    s.advance(31)
    assert s.state(qr) == "SUSPENDED"
    return qr, node


def test_suspended_queued_resource_is_gone_within_one_tick_and_its_quota_is_free(janitor_stack):
    s = janitor_stack
    qr, _ = preempted_busy_tpu(s, "r8")
    held = s.control.quota(s.fleet.project, WIN_ZONE, "v4", "spot")["used"]  # ours and the foreign ones

    s.tick()

    assert s.deleted_ids() == [qr.rsplit("/", 1)[-1]]
    assert s.state(qr) is None
    assert s.control.quota(s.fleet.project, WIN_ZONE, "v4", "spot")["used"] == held - 4  # a v4-8 is 4 chips


@pytest.mark.parametrize("classified", [False, True])
def test_failed_queued_resource_is_deleted_only_once_the_claimer_classified_it(janitor_stack, classified):
    s = janitor_stack
    qr = s.create_owned("r9", WIN_ZONE)
    s.control.fail(qr, "unknown")
    if classified:  # the claimer read the failure, backed off or dropped the zone, and recorded the class
        s.db.collection("queued_resources").document(qr.rsplit("/", 1)[-1]).update(
            {"state": "FAILED", "failure_class": "unknown"})
    s.fleet_event("FAILED", qr, "r9")
    s.tick()
    if classified:
        assert s.deleted_ids() == [qr.rsplit("/", 1)[-1]] and s.state(qr) is None
    else:  # the claimer's to read first: neither the event nor the tick deletes it
        assert s.deletes() == [] and s.state(qr) == "FAILED"


def test_preempted_attempt_gets_its_tpu_deleted(janitor_stack):
    s = janitor_stack
    qr, node = preempted_busy_tpu(s, "r10")
    s.post_twice("/push/attempt-events", {"kind": "ended", "job_id": "j1", "attempt": 1, "attempt_id": "j1-1",
                                          "node": node, "outcome": "preempted",
                                          "at": datetime.now(timezone.utc).isoformat()})
    assert s.deleted_ids() == [qr.rsplit("/", 1)[-1]]


def test_orphans_are_deleted_on_a_tick_and_the_scan_is_rate_limited(janitor_stack):
    s = janitor_stack
    orphan = s.create_owned("lost", WIN_ZONE, record=False)  # ours, but no Firestore document names it
    known = s.create_owned("r11", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)

    s.fleet_event("ACTIVE", known, "r11")
    assert s.deletes() == []  # events never scan

    # Known only through a TPU document of another id that names it: the scan must read every document then.
    named = s.create_owned("r12", THIRD_ZONE, record=False)
    s.db.collection(store.TPUS).document("renamed").set({"fleet": s.fleet.name, "queued_resource": named,
                                                         "state": "idle"})
    s.tick()
    lists = [c for c in s.control.calls(method="GET") if s.fleet.project in c["path"] and c["path"].endswith(
        ("/queuedResources", "/nodes"))]
    assert s.deleted_ids() == [orphan.rsplit("/", 1)[-1]]
    assert s.state(named) is not None
    assert len(lists) == 2 * 3  # queued resources and nodes, in each of the fleet's 3 zones, once
    s.tick()
    lists_after = [c for c in s.control.calls(method="GET") if s.fleet.project in c["path"] and c["path"].endswith(
        ("/queuedResources", "/nodes"))]
    assert len(lists_after) == len(lists)  # rate-limited: no second scan within the interval
    assert s.state(known) == "ACTIVE"


@pytest.mark.fleet(claim={"orphan_grace_seconds": 3600})
def test_orphans_get_a_grace_period(janitor_stack):
    s = janitor_stack
    orphan = s.create_owned("lost2", WIN_ZONE, record=False)
    s.tick()
    assert s.deletes() == [] and s.state(orphan) == "ACCEPTED"
    seen = s.db.collection("janitor").document(s.fleet.name).get().to_dict()["orphan_first_seen"]
    assert [e["name"] for e in seen] == [orphan]


@pytest.mark.fleet(idle_timeout_seconds=0)
def test_idle_tpu_that_lost_our_marks_is_left_alone_and_the_tick_succeeds(janitor_stack):
    s = janitor_stack
    # Recorded as ours, but the resource itself carries another owner's label (e.g. the prefix was changed).
    name = s.create("tpuq-r9-" + WIN_ZONE, WIN_ZONE, {"tpuq-owner": "someone-else"})
    s.advance(ACTIVE_AFTER + 1)
    tpu_id = s.record_tpu(name, idle_since=datetime.now(timezone.utc) - timedelta(hours=1))
    s.tick()  # post_twice inside asserts every delivery is acknowledged
    assert s.deletes() == []
    assert s.tpu_doc(tpu_id)["state"] == "gone" and "left alone" in s.tpu_doc(tpu_id)["gone_reason"]
