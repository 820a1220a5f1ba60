"""The scheduler's pure decisions, without emulators: the pass over a snapshot, a lost node, a cancel."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.fleet import FleetFile, RetryBudgets
from tpuq.contracts.messages import AttemptOutcome, FailureClass, FleetEvent, FleetEventKind
from tpuq.scheduler import lifecycle
from tpuq.scheduler.decide import PassSnapshot, decide_pass, entries_to_count, queue_of

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONE = "us-central2-b"


def fleet(count: int = 4, **kw) -> FleetFile:
    return FleetFile.model_validate({"name": "test", "project": "p", "tpus": [
        {"id": "v4", "type": "v4-8", "zones": [ZONE], "count": count, **kw}]})


def job(job_id: str, age: int = 0, **kw) -> tuple[str, dict]:
    spec = {"id": job_id, "tpu": kw.pop("tpu", ["v4-8"]), "command": "train", **kw.pop("spec", {})}
    return job_id, {"id": job_id, "state": "pending", "spec": spec, "attempt": 0,
                    "submit_time": NOW - timedelta(seconds=age), **kw}


def tpu(name: str, **kw) -> dict:
    return {"name": f"projects/p/locations/{ZONE}/nodes/{name}", "type": "v4-8", "zone": ZONE,
            "region": "us-central2", "entry_id": "v4", "state": "idle", "endpoints": [], **kw}


def decided(jobs, tpus, live=0, open_=0, fleet_file=None, runner_bucket="tpuq-runner"):
    snapshot = PassSnapshot(queue=queue_of(list(jobs)), idle_tpus=list(tpus), live_tpus={"v4": live},
                            open_requests={"v4": open_})
    return decide_pass(snapshot, fleet_file if fleet_file is not None else fleet(), runner_bucket, NOW)


@pytest.mark.parametrize("case, jobs, tpus, max_slices, live, open_, assigned, asked, blocked", [
    ("an idle TPU goes to the oldest job",
     [job("new", 1), job("old", 9)], [tpu("n1")], 4, 1, 0, {"old": "n1"}, ["new"], []),
    ("no idle TPU: jobs ask in queue order, within the entry's room",
     [job("a", 3), job("b", 2), job("c", 1)], [], 4, 2, 0, {}, ["a", "b"], ["c"]),
    ("open requests take room too",
     [job("a", 3), job("b", 2)], [], 4, 2, 1, {}, ["a"], ["b"]),
    ("a job with an open request asks no more",
     [job("a", capacity_request={"id": "r-a-1", "entry_id": "v4"})], [], 4, 0, 1, {}, [], []),
    ("the request an assignment closes is room for the next waiting job",
     [job("a", 3, capacity_request={"id": "r-a-1", "entry_id": "v4"}), job("b", 2)], [tpu("n1")], 4, 3, 1,
     {"a": "n1"}, ["b"], []),
    ("a quarantined TPU is never assigned",
     [job("a")], [tpu("n1", quarantined=True)], 4, 1, 0, {}, ["a"], []),
    ("a job that names its TPU never asks, and says what it waits for",
     [job("a", spec={"tpu_name": "mine"})], [tpu("n1")], 4, 1, 0, {}, [], ["a"]),
    ("no fitting entry: blocked with the reason",
     [job("a", tpu=["v5e-8"])], [], 4, 0, 0, {}, [], ["a"]),
])
def test_pass_decision(case, jobs, tpus, max_slices, live, open_, assigned, asked, blocked):
    d = decided(jobs, tpus, live, open_, fleet(count=max_slices))
    assert {a.job_id: a.tpu_name.rsplit("/", 1)[-1] for a in d.assignments} == assigned, case
    assert [a.job_id for a in d.asks] == asked, case
    assert sorted(d.blocked) == blocked, case


def test_no_fleet_matches_but_never_asks():
    d = decide_pass(PassSnapshot(queue=queue_of([job("a"), job("b")]), idle_tpus=[tpu("n1")]), None, "tpuq-runner",
                    NOW)
    assert len(d.assignments) == 1 and not d.asks
    assert list(d.blocked) == [j for j in ("a", "b") if j not in {a.job_id for a in d.assignments}]  # says why


def test_a_job_that_can_never_be_assigned_is_rejected_through_the_table_and_its_tpu_stays_free():
    d = decided([job("a")], [tpu("n1")], runner_bucket=None)
    [(job_id, _tpu, fields)] = d.unassignable
    assert job_id == "a" and fields["state"] == "rejected" and "no runner bucket" in fields["reason"]
    assert not d.assignments


def test_a_stored_job_that_does_not_validate_is_skipped_and_the_others_go_on():
    bad = ("bad", {"id": "bad", "state": "pending", "spec": {"id": "bad"}, "submit_time": NOW})
    d = decided([bad, job("a")], [tpu("n1")])
    assert "bad" in d.unreadable and [a.job_id for a in d.assignments] == ["a"]


def test_a_blocked_reason_already_stored_is_not_written_again():
    first = decided([job("a", tpu=["v5e-8"])], [])
    again = decided([job("a", tpu=["v5e-8"], blocked=first.blocked["a"])], [])
    assert first.blocked and not again.blocked


def test_entries_to_count_are_those_of_jobs_that_may_ask():
    assert entries_to_count(queue_of([job("a")]), fleet()) == ["v4"]
    assert entries_to_count(queue_of([job("a", capacity_request={"id": "r"})]), fleet()) == []
    assert entries_to_count(queue_of([job("a")]), None) == []


# ------------------------------------------------------------------ node lost

NODE = f"projects/p/locations/{ZONE}/nodes/n1"
GONE = FleetEvent(kind=FleetEventKind.suspended, fleet="test", queued_resource="qr", zone=ZONE, type="v4-8",
                  node=NODE, at=NOW)


def lost(tpu_doc, holder, job_doc):
    return lifecycle.node_lost(tpu_doc, holder, job_doc, GONE, RetryBudgets(), NOW, random.Random(1))


def test_node_lost_requeues_the_attempt_it_held_once():
    busy = {"name": NODE, "short": "n1", "state": "busy", "job_id": "j1", "attempt_id": "j1-1"}
    running = {"id": "j1", "state": "running", "attempt": 1, "attempt_id": "j1-1", "spec": {}, "region": "r"}
    result = lost(busy, "j1", running)
    assert result.tpu["state"] == "gone" and result.end.job["state"] == "pending"
    assert result.end.job["preemptions"] == 1 and "SUSPENDED" in result.end.job["reason"]
    again = lost({**busy, **result.tpu}, "j1", {**running, **result.end.job})
    assert again.tpu is None and again.end.job is None  # a redelivery writes nothing


@pytest.mark.parametrize("kind, recorded, says", [
    (FleetEventKind.suspended, None, "TPU n1 preempted (its queued resource is SUSPENDED)"),
    # NOT_FOUND after the SUSPENDED this TPU recorded: still the preemption
    (FleetEventKind.gone, "SUSPENDED", "TPU n1 preempted (its queued resource is SUSPENDED)"),
    # NOT_FOUND with no SUSPENDED seen: what is known, no more
    (FleetEventKind.gone, None, "TPU n1 gone: its queued resource no longer exists (deleted outside tpuq, or a "
                                "preempted TPU deleted before tpuq saw it SUSPENDED)"),
    (FleetEventKind.failed, None, "TPU n1 failed (its queued resource is FAILED: internal error)"),
])
def test_a_lost_nodes_reason_says_preempted_in_words_never_a_bare_state(kind, recorded, says):
    """Issue 35: a preempted attempt's reason read `TPU n1 GONE`."""
    busy = {"name": NODE, "short": "n1", "state": "busy", "job_id": "j1", "attempt_id": "j1-1",
            **({"gone_reason": recorded} if recorded else {})}
    running = {"id": "j1", "state": "running", "attempt": 1, "attempt_id": "j1-1", "spec": {}, "region": "r"}
    event = GONE.model_copy(update={"kind": kind, "failure_message": "internal error" if kind is FleetEventKind.failed
                                    else None})
    result = lifecycle.node_lost(busy, "j1", running, event, RetryBudgets(), NOW, random.Random(1))
    assert says in result.end.job["reason"], result.end.job["reason"]
    assert not result.end.job["reason"].rstrip().endswith(("GONE", "SUSPENDED"))


@pytest.mark.parametrize("case, tpu_doc, holder, job_doc, tpu_gone, job_ends, moved", [
    ("unknown node: recorded gone", None, None, None, True, False, False),
    ("idle node", {"state": "idle", "job_id": None}, None, None, True, False, False),
    ("changed hands since read", {"state": "busy", "job_id": "j2"}, "j1", None, False, False, True),
    ("the job moved to another attempt", {"state": "busy", "job_id": "j1", "attempt_id": "j1-1"}, "j1",
     {"id": "j1", "state": "running", "attempt": 2, "attempt_id": "j1-2"}, True, False, False),
])
def test_node_lost_cases(case, tpu_doc, holder, job_doc, tpu_gone, job_ends, moved):
    result = lost(tpu_doc, holder, job_doc)
    assert (result.tpu is not None and result.tpu["state"] == "gone") is tpu_gone, case
    assert (result.end is not None) is job_ends, case
    assert result.job_moved is moved, case


@pytest.mark.parametrize("outcome, suspect", [
    (AttemptOutcome.preempted, True), (AttemptOutcome.infra_failed, True),
    (AttemptOutcome.succeeded, False), (AttemptOutcome.failed, False), (AttemptOutcome.cancelled, False),
])
def test_only_preempted_and_infra_failed_ends_make_a_tpu_suspect(outcome, suspect):
    assert (lifecycle.suspect_reason("j1-1", outcome) is not None) is suspect


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "rejected"])
def test_cancel_of_a_finished_job_writes_nothing(state):
    assert lifecycle.cancel({"state": state}, "r", NOW).job is None


def _event(kind, node=NODE, request_id=None, **kw):
    return FleetEvent(kind=kind, fleet="test", queued_resource="qr", zone=ZONE, type="v4-8", node=node,
                      request_id=request_id, at=NOW, **kw)


@pytest.mark.parametrize("event, lost, reason", [
    (_event(FleetEventKind.suspended), True, None),
    (_event(FleetEventKind.gone), True, None),
    (_event(FleetEventKind.failed), True, None),
    (_event(FleetEventKind.failed, node=None, request_id="r-j1-1", failure_message="no quota"), False,
     f"capacity request failed in {ZONE} (unknown): no quota"),
    (_event(FleetEventKind.failed, node=None, request_id="r-j1-1", failure_class=FailureClass.project,
            failure_message="403 POST http://...: Billing account for project 'p' is not found."), False,
     f"v4-8 in {ZONE}: the project refuses new TPUs (`tpuq fleet` says why and what to run)"),
    (_event(FleetEventKind.failed, node=None, request_id="r-j1-1", failure_class=FailureClass.capacity,
            failure_message="There is no more capacity in the zone"), False,
     f"v4-8 in {ZONE}: no capacity now (stockout); racing on in the other zones"),
    (_event(FleetEventKind.failed, node=None, request_id="r-j1-1", failure_class=FailureClass.network,
            failure_message="The referenced subnetwork resource cannot be found."), False,
     f"v4-8 in {ZONE}: the fleet's subnetwork does not exist in region {ZONE.rsplit('-', 1)[0]} (subnets are "
     "regional); the region is dropped (`tpuq fleet` says what to run)"),
    (_event(FleetEventKind.failed, node=None), False, None),  # no request to explain
    (_event(FleetEventKind.suspended, node=None), False, None),
    (_event(FleetEventKind.active), False, None),
    (_event(FleetEventKind.provisioning, node=None, request_id="r-j1-1"), False, None),
])
def test_what_a_fleet_event_means_to_the_scheduler(event, lost, reason):
    assert lifecycle.node_is_lost(event) is lost
    assert lifecycle.request_failure_reason(event) == reason


def test_every_job_left_waiting_shows_what_holds_it():
    """The liveness rule (tpuq.contracts.liveness): a job neither assigned nor asking states its reason."""
    named = decided([job("a", spec={"tpu_name": "mine"})], [tpu("n1")])
    assert named.blocked == {"a": "waiting for TPU mine (its tpu_name) to be idle and healthy"}
    no_fleet = decide_pass(PassSnapshot(queue=queue_of([job("a")]), idle_tpus=[]), None, "b", NOW)
    assert "no fleet file is stored" in no_fleet.blocked["a"] and not no_fleet.asks
