"""Node health and maintenance, the pure rules: what the API's fields mean (`tpuq.contracts.documents.NodeHealth`), which
idle TPU the pass skips (`scheduler.decide`), what the claimer announces (`claimer.decide`), what the scheduler
records (`scheduler.lifecycle`) and how the executor ends an attempt on an unhealthy node (`executor.outcome`)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.claimer.decide import decide_observed
from tpuq.claimer.model import ClaimState, NodeInfo, Observation, Observed, QrRecord
from tpuq.contracts.documents import MAINTENANCE_HORIZON, NodeHealth, TpuHealth, qr_from_doc, qr_to_doc
from tpuq.executor import decide as executor_decide
from tpuq.executor.outcome import Decided, NodeState, WorkerStatus, decide_outcome
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import AttemptOutcome, FleetEvent, FleetEventKind, WorkerEndpoint
from tpuq.scheduler import lifecycle
from tpuq.scheduler.decide import PassSnapshot, decide_pass, queue_of, tpu_refuses_new_job

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONE = "us-central2-b"


def at(hours: float) -> str:
    return (NOW + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def maintenance(start_hours: float | None, status: str = "PENDING", end_hours: float | None = None) -> dict:
    m = {"type": "SCHEDULED", "maintenanceStatus": status, "canReschedule": True}
    if start_hours is not None:
        m["windowStartTime"] = at(start_hours)
    if end_hours is not None:
        m["windowEndTime"] = at(end_hours)
    return m


# ------------------------------------------------------------------ NodeHealth: the API's fields


@pytest.mark.parametrize("case, node, unhealthy, refuses", [
    ("no health field (HEALTH_UNSPECIFIED): not evidence", {}, None, None),
    ("HEALTHY", {"health": "HEALTHY"}, None, None),
    ("a value Google added since reads as absent", {"health": "SOMETHING_NEW"}, None, None),
    ("TIMEOUT", {"health": "TIMEOUT"}, "TIMEOUT", "TIMEOUT"),
    ("the ML stack, with its symptom and description",
     {"health": "UNHEALTHY_TENSORFLOW", "healthDescription": "libtpu crashed",
      "symptoms": [{"symptomType": "HBM_OUT_OF_MEMORY", "workerId": "1", "details": "HBM full",
                    "createTime": "2026-01-01T00:00:00Z"}]},
     "UNHEALTHY_TENSORFLOW (libtpu crashed; HBM_OUT_OF_MEMORY on worker 1: HBM full)", "UNHEALTHY_TENSORFLOW"),
    ("under maintenance", {"health": "UNHEALTHY_MAINTENANCE", "upcomingMaintenance": maintenance(-1, "ONGOING")},
     "UNHEALTHY_MAINTENANCE", "UNHEALTHY_MAINTENANCE"),
    ("healthy, maintenance within the horizon", {"health": "HEALTHY", "upcomingMaintenance": maintenance(2)},
     None, "maintenance (SCHEDULED) from 2026-01-01 02:00 UTC"),
    ("healthy, maintenance just inside the horizon",
     {"health": "HEALTHY", "upcomingMaintenance": maintenance(MAINTENANCE_HORIZON.total_seconds() / 3600)},
     None, "maintenance (SCHEDULED)"),
    ("healthy, maintenance beyond the horizon", {"health": "HEALTHY", "upcomingMaintenance": maintenance(25)},
     None, None),
    ("healthy, maintenance with no start given: soon", {"health": "HEALTHY", "upcomingMaintenance": maintenance(None)},
     None, "maintenance (SCHEDULED) at a time not given"),
    ("healthy, maintenance ONGOING (window not given)",
     {"health": "HEALTHY", "upcomingMaintenance": maintenance(None, "ONGOING")}, None, "maintenance (SCHEDULED) under way"),
    ("a window already over is no reason", {"health": "HEALTHY", "upcomingMaintenance": maintenance(-3, end_hours=-1)},
     None, None),
])
def test_what_the_node_fields_mean(case, node, unhealthy, refuses):
    health = NodeHealth.from_api(node)
    assert health.unhealthy() == unhealthy, case
    reason = health.refuses_new_job(NOW)
    assert (reason is None) == (refuses is None) and (refuses is None or reason.startswith(refuses)), (case, reason)
    assert NodeHealth.from_doc({"node_health": health.to_doc()}) == health, case  # stored and read back alike


def test_an_unreadable_stored_health_reads_as_unknown_never_an_error():
    assert NodeHealth.from_doc({"node_health": {"health": 7}}) is None
    assert NodeHealth.from_doc({}) is None and NodeHealth.from_doc(None) is None


# ------------------------------------------------------------------ the pass skips what refuses new jobs


def fleet() -> FleetFile:
    return FleetFile.model_validate({"name": "test", "project": "p", "tpus": [
        {"id": "v4", "type": "v4-8", "zones": [ZONE], "count": 4}]})


def job(job_id: str, age: int = 0) -> tuple[str, dict]:
    return job_id, {"id": job_id, "state": "pending", "spec": {"id": job_id, "tpu": ["v4-8"], "command": "train"},
                    "attempt": 0, "submit_time": NOW - timedelta(seconds=age)}


def tpu(name: str, node: dict | None = None, **kw) -> dict:
    doc = {"name": f"projects/p/locations/{ZONE}/nodes/{name}", "type": "v4-8", "zone": ZONE,
           "region": "us-central2", "entry_id": "v4", "state": "idle", "endpoints": [], **kw}
    if node is not None:
        doc["node_health"] = NodeHealth.from_api(node).to_doc()
    return doc


SICK = {"health": "UNHEALTHY_TENSORFLOW", "symptoms": [{"symptomType": "MESH_BUILD_FAIL", "workerId": "0"}]}
SOON = {"health": "HEALTHY", "upcomingMaintenance": maintenance(3)}
LATER = {"health": "HEALTHY", "upcomingMaintenance": maintenance(72)}


@pytest.mark.parametrize("case, tpus, assigned", [
    ("a healthy TPU takes the job", [tpu("a", {"health": "HEALTHY"})], {"old": "a"}),
    ("one never read (no node_health) too", [tpu("a")], {"old": "a"}),
    ("an unhealthy one takes none", [tpu("a", SICK)], {}),
    ("nor one whose maintenance opens within the horizon", [tpu("a", SOON)], {}),
    ("one whose maintenance is days away still does", [tpu("a", LATER)], {"old": "a"}),
    ("under maintenance: none", [tpu("a", {"health": "UNHEALTHY_MAINTENANCE"})], {}),
    ("the healthy one of two gets the oldest job, the other none",
     [tpu("a", SOON), tpu("b", {"health": "HEALTHY"})], {"old": "b"}),
    ("two healthy, one sick: two jobs run", [tpu("a"), tpu("b", SICK), tpu("c")], {"old": "a", "new": "c"}),
    ("quarantined stays skipped", [tpu("a", {"health": "HEALTHY"}, quarantined=True)], {}),
])
def test_the_pass_skips_an_idle_tpu_that_refuses_new_jobs(case, tpus, assigned):
    snapshot = PassSnapshot(queue=queue_of([job("old", 9), job("new", 1)]), idle_tpus=tpus, live_tpus={"v4": len(tpus)},
                            open_requests={"v4": 0})
    d = decide_pass(snapshot, fleet(), "tpuq-runner", NOW)
    assert {a.job_id: a.tpu_name.rsplit("/", 1)[-1] for a in d.assignments} == assigned, case


def test_the_reason_a_tpu_is_skipped_reads_as_the_api_says():
    assert tpu_refuses_new_job(tpu("a", SICK), NOW) == "UNHEALTHY_TENSORFLOW (MESH_BUILD_FAIL on worker 0)"
    assert tpu_refuses_new_job(tpu("a", SOON), NOW) == "maintenance (SCHEDULED) from 2026-01-01 03:00 UTC"
    assert tpu_refuses_new_job(tpu("a", SOON), NOW + timedelta(hours=4)) is not None  # window open: still refused
    assert tpu_refuses_new_job(tpu("a", LATER), NOW) is None


# ------------------------------------------------------------------ the claimer announces a change, once


def claim_state(health: NodeHealth | None) -> tuple[ClaimState, QrRecord]:
    f = FleetFile.model_validate({"name": "f1", "project": "p", "owner_prefix": "tq",
                                  "tpus": [{"id": "v4", "type": "v4-8", "zones": [ZONE], "count": 2}]})
    qr = QrRecord(qr_id="tq-r1-z", fleet="f1", project="p", request_id="r1", entry_id="v4", zone=ZONE, type="v4-8",
                  spot=True, generation=0, state="ACTIVE", created_at=NOW, updated_at=NOW,
                  node=f"projects/p/locations/{ZONE}/nodes/tq-r1-z",
                  endpoints=(WorkerEndpoint(worker_id=0, ip="10.0.0.2"),), node_health=health)
    return ClaimState(f, qrs={qr.qr_id: qr}), qr


def read_again(qr: QrRecord, node: dict | None) -> Observed:
    info = None if node is None else NodeInfo(qr.node, qr.endpoints, NodeHealth.from_api(node))
    return Observed({qr.qr_id: Observation.found("ACTIVE", node=info)}, plan=False)


HEALTHY = NodeHealth.from_api({"health": "HEALTHY"})


@pytest.mark.parametrize("case, before, node, announced", [
    ("the same health again: nothing", HEALTHY, {"health": "HEALTHY"}, None),
    ("turned unhealthy: announced", HEALTHY, SICK, "UNHEALTHY_TENSORFLOW"),
    ("a maintenance notice: announced", HEALTHY, SOON, "HEALTHY"),
    ("first read since an older claimer recorded none", None, {"health": "HEALTHY"}, "HEALTHY"),
    ("the node read failed: nothing concluded", HEALTHY, None, None),
])
def test_the_claimer_announces_a_change_of_node_health_once(case, before, node, announced):
    state, qr = claim_state(before)
    effects = decide_observed(state, read_again(qr, node), NOW, random.Random(1))
    events = [e for e in effects.events if e.kind is FleetEventKind.node_health]
    if announced is None:
        assert events == [] and qr.qr_id not in effects.qrs, case
        return
    [event] = events
    assert event.node == qr.node and event.node_health.health.value == announced, case
    stored = effects.qrs[qr.qr_id]
    assert stored.node_health == event.node_health, case
    assert qr_from_doc(qr_to_doc(stored)).node_health == stored.node_health, case  # through Firestore's shape
    again = decide_observed(effects.applied(state), read_again(stored, node), NOW, random.Random(1))  # the next pass
    assert not [e for e in again.events if e.kind is FleetEventKind.node_health], case


# ------------------------------------------------------------------ the scheduler records it


def health_event(node: dict | None) -> FleetEvent:
    return FleetEvent(kind=FleetEventKind.node_health, fleet="f1", queued_resource="q", zone=ZONE, type="v4-8",
                      node=f"projects/p/locations/{ZONE}/nodes/n1", at=NOW,
                      node_health=NodeHealth.from_api(node) if node is not None else None)


@pytest.mark.parametrize("case, stored, node, written", [
    ("a busy TPU's record changes (the executor judges it)", {"state": "busy"}, SICK, True),
    ("an idle one's too", {"state": "idle"}, SOON, True),
    ("the same again: nothing", {"state": "idle", "node_health": HEALTHY.to_doc()}, {"health": "HEALTHY"}, False),
    ("gone is final", {"state": "gone"}, SICK, False),
    ("never recorded: nothing (the ACTIVE event makes the record)", None, SICK, False),
    ("no health in the event: nothing", {"state": "idle"}, None, False),
])
def test_the_scheduler_records_the_node_s_health(case, stored, node, written):
    fields = lifecycle.tpu_on_health(stored, health_event(node), NOW)
    assert bool(fields) == written, case
    if written:
        assert NodeHealth.from_doc(fields) == NodeHealth.from_api(node)
        assert set(fields) == {"node_health", "node_health_at", "updated_at"}


def test_an_active_event_carries_the_node_s_health_into_a_new_tpu_record():
    event = FleetEvent(kind=FleetEventKind.active, fleet="f1", queued_resource="q", zone=ZONE, type="v4-8",
                       node=f"projects/p/locations/{ZONE}/nodes/n1", at=NOW, node_health=NodeHealth.from_api(SOON),
                       endpoints=[WorkerEndpoint(worker_id=0, ip="10.0.0.2")])
    doc = lifecycle.tpu_on_active(None, event, None, NOW)
    assert NodeHealth.from_doc(doc) == NodeHealth.from_api(SOON)
    # An `existing:` node's ACTIVE comes every tick: only a change of health is written.
    assert lifecycle.tpu_on_active(doc, event, None, NOW) is None
    sick = lifecycle.tpu_on_active(doc, event.model_copy(update={"node_health": NodeHealth.from_api(SICK)}), None, NOW)
    assert set(sick) == {"node_health", "node_health_at", "updated_at"}


def test_an_older_reading_delivered_late_never_replaces_a_newer_one():
    """Pub/Sub may push a node's ACTIVE again long after a later NODE_HEALTH (a redelivery after a failed push):
    its older, healthy reading must not clear the sickness the executor and the pass judge by."""
    active = FleetEvent(kind=FleetEventKind.active, fleet="f1", queued_resource="q", zone=ZONE, type="v4-8",
                        node=f"projects/p/locations/{ZONE}/nodes/n1", at=NOW, node_health=HEALTHY,
                        endpoints=[WorkerEndpoint(worker_id=0, ip="10.0.0.2")])
    doc = lifecycle.tpu_on_active(None, active, None, NOW)
    sick = health_event(SICK).model_copy(update={"at": NOW + timedelta(minutes=5)})
    doc = {**doc, **lifecycle.tpu_on_health(doc, sick, NOW + timedelta(minutes=5))}
    assert lifecycle.tpu_on_active(doc, active, None, NOW + timedelta(minutes=9)) is None  # the late copy
    assert lifecycle.tpu_on_health(doc, health_event({"health": "HEALTHY"}), NOW + timedelta(minutes=9)) is None
    assert NodeHealth.from_doc(doc) == NodeHealth.from_api(SICK)
    later = health_event({"health": "HEALTHY"}).model_copy(update={"at": NOW + timedelta(minutes=8)})
    assert NodeHealth.from_doc(lifecycle.tpu_on_health(doc, later, NOW)).health is TpuHealth.HEALTHY  # newer: taken


# ------------------------------------------------------------------ the executor ends the attempt, like a lost host


def status(worker: int, code: int) -> WorkerStatus:
    return WorkerStatus(worker_id=worker, attempt_id="j-1", ended_at=NOW, exit_code=code)


PROBLEM = "UNHEALTHY_TENSORFLOW (HBM_OUT_OF_MEMORY on worker 0)"


@pytest.mark.parametrize("case, statuses, node_state, problem, outcome", [
    ("still running on an unhealthy node: infra failure", {}, NodeState.ready, PROBLEM, AttemptOutcome.infra_failed),
    ("one worker failed there: still the node's fault, not the job's", {0: status(0, 1)}, NodeState.ready, PROBLEM,
     AttemptOutcome.infra_failed),
    ("every worker exited 0 first: succeeded", {0: status(0, 0)}, NodeState.ready, PROBLEM, AttemptOutcome.succeeded),
    ("preempted wins (its own budget)", {}, NodeState.preempted, PROBLEM, AttemptOutcome.preempted),
    ("healthy: keep waiting", {}, NodeState.ready, None, None),
])
def test_an_attempt_on_an_unhealthy_node_ends_as_an_infra_failure(case, statuses, node_state, problem, outcome):
    d = decide_outcome(worker_count=1, statuses=statuses, node_state=node_state, now=NOW, node_problem=problem)
    if outcome is None:
        assert not isinstance(d, Decided), case
        return
    assert isinstance(d, Decided) and d.outcome is outcome, (case, d)
    if outcome is AttemptOutcome.infra_failed:
        assert d.detail.startswith(f"node unhealthy: {PROBLEM}"), d.detail


@pytest.mark.parametrize("case, doc, problem", [
    ("no record", None, None),
    ("never read", {"state": "busy"}, None),
    ("healthy", {"state": "busy", "node_health": HEALTHY.to_doc()}, None),
    ("maintenance only scheduled: the attempt goes on", {"node_health": NodeHealth.from_api(SOON).to_doc()}, None),
    ("unhealthy", {"node_health": NodeHealth.from_api(SICK).to_doc()}, "UNHEALTHY_TENSORFLOW"),
    ("under maintenance", {"node_health": NodeHealth.from_api({"health": "UNHEALTHY_MAINTENANCE"}).to_doc()},
     "UNHEALTHY_MAINTENANCE"),
])
def test_the_executor_reads_the_node_problem_from_the_tpu_record(case, doc, problem):
    found = executor_decide.node_problem(doc)
    assert (found or "").startswith(problem or "") and (found is None) == (problem is None), case


def test_the_infra_end_counts_against_the_infra_budget_and_keeps_the_region():
    stored = {"id": "j", "state": "running", "attempt": 1, "attempt_id": "j-1", "region": "us-central2",
              "spec": {"id": "j", "tpu": ["v4-8"], "command": "train"}, "infra_failures": 0, "preemptions": 0}
    from tpuq.contracts.fleet import RetryBudgets

    end = lifecycle.attempt_ended(stored, 1, AttemptOutcome.infra_failed, f"node unhealthy: {PROBLEM}",
                                  RetryBudgets(), NOW, random.Random(1))
    assert end.job["state"] == "pending" and end.job["infra_failures"] == 1 and "preemptions" not in end.job
    assert end.job["pinned_region"] == "us-central2"
    assert lifecycle.suspect_reason("j-1", AttemptOutcome.infra_failed)  # the TPU is quarantined when freed
    assert TpuHealth.UNHEALTHY_TENSORFLOW.value in end.job["reason"]


@pytest.mark.parametrize("node, shown", [
    (None, ""),  # never read
    ({"health": "HEALTHY"}, "HEALTHY"),
    (LATER, "HEALTHY"),  # maintenance days away: it still takes jobs
    (SOON, "maintenance (SCHEDULED) from 2026-01-01 03:00 UTC"),
    (SICK, "UNHEALTHY_TENSORFLOW (MESH_BUILD_FAIL on worker 0)"),
])
def test_tpuq_fleet_shows_why_a_tpu_takes_no_job(node, shown):
    from tpuq.operations.fleetreport import health_note

    assert health_note(tpu("a", node), NOW) == shown
