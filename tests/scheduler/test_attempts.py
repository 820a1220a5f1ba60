"""Attempt events and node loss: running, finished, retried in the same region, out of budget."""

from __future__ import annotations

from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.messages import AttemptEvent, FleetEventKind

from tests.scheduler.conftest import active, fleet_file, utc

TWO_REGIONS = [
    {"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 4},
    {"id": "v4-eu", "type": "v4-8", "zones": ["europe-west4-a"], "count": 4},
]


def started(job_id="j1", attempt=1, node="n1") -> AttemptEvent:
    return AttemptEvent(kind="started", job_id=job_id, attempt=attempt, attempt_id=f"{job_id}-{attempt}",
                        node=f"projects/tpuq-local/locations/us-central2-b/nodes/{node}", at=utc(2026, 1, 1))


def ended(outcome, job_id="j1", attempt=1, node="n1", detail=None) -> AttemptEvent:
    return AttemptEvent(kind="ended", job_id=job_id, attempt=attempt, attempt_id=f"{job_id}-{attempt}",
                        node=f"projects/tpuq-local/locations/us-central2-b/nodes/{node}", outcome=outcome,
                        detail=detail, at=utc(2026, 1, 1))


def running_job(sched, **spec):
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train", **spec})
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("attempt-events", started())
    first = sched.drain("assignments")
    assert [m["attempt_id"] for m in first] == ["j1-1"]
    return first[0]


def test_started_marks_running_and_pins_the_region(sched):
    running_job(sched)
    job = sched.job("j1")
    assert job["state"] == "running" and job["pinned_region"] == "us-central2"
    assert sched.attempts("j1")["1"]["state"] == "running"
    sched.deliver("attempt-events", started(attempt=7))  # not the current attempt: dropped
    assert sched.job("j1")["updated_at"] == job["updated_at"]


def test_success_finishes_the_job_and_frees_the_tpu(sched):
    running_job(sched)
    sched.deliver("attempt-events", ended("succeeded"))
    job, tpu = sched.job("j1"), sched.tpu("n1")
    assert job["state"] == "succeeded"
    assert tpu["state"] == "idle" and tpu["job_id"] is None and tpu["idle_since"] is not None
    assert sched.attempts("j1")["1"]["outcome"] == "succeeded"
    assert sched.drain("assignments") == []


def test_application_failure_is_terminal_with_the_detail(sched):
    running_job(sched)
    sched.deliver("attempt-events", ended("failed", detail="worker 0 exited 3"))
    job = sched.job("j1")
    assert job["state"] == "failed" and job["reason"] == "worker 0 exited 3"
    assert sched.tpu("n1")["state"] == "idle"
    assert sched.drain("assignments") == []


def test_ended_before_started_still_ends_the_attempt(sched):
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train"})
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("attempt-events", ended("failed_setup", detail="bundle missing"))
    sched.deliver("attempt-events", started())  # overtaken: the job has ended and stays so
    assert sched.job("j1")["state"] == "failed" and sched.job("j1")["reason"] == "bundle missing"


def test_a_start_handled_after_the_end_still_says_when_the_attempt_began(sched):
    """Pub/Sub does not order: a short attempt's end can be handled first. The start leaves the state alone but
    records the executor's start time on the attempt and the job (`tpuq status`, the dashboard, cost, TPUQ_RESUMING)."""
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "echo evaluated"})
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("attempt-events", ended("succeeded"))
    sched.deliver("attempt-events", started())
    sched.deliver("attempt-events", started())  # and again: the same time, once
    job, attempt = sched.job("j1"), sched.attempts("j1")["1"]
    assert job["state"] == "succeeded" and attempt["state"] == "ended" and attempt["outcome"] == "succeeded"
    assert attempt["started_at"] == job["started_at"] == utc(2026, 1, 1)


def test_preempted_attempt_reruns_in_its_region_with_the_same_checkpoints(sched):
    save_fleet(sched.db, fleet_file(tpus=TWO_REGIONS), utc(2026, 1, 1))
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train",
                           "buckets": ["gs://ckpt-us-central2", "gs://ckpt-europe-west4"]})
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("attempt-events", started())
    [first] = sched.drain("assignments")

    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.suspended))
    job = sched.job("j1")
    assert job["state"] == "pending" and job["preemptions"] == 1 and job["pinned_region"] == "us-central2"
    assert sched.tpu("n1")["state"] == "gone"
    assert sched.attempts("j1")["1"]["outcome"] == "preempted"
    # The executor reports the same attempt as preempted too: only the first report counts.
    sched.deliver("attempt-events", ended("preempted"))
    assert sched.job("j1")["preemptions"] == 1

    sched.deliver("fleet-events", active("eu1", zone="europe-west4-a", entry_id="v4-eu"))
    assert sched.job("j1")["state"] == "pending"  # another region: not where its checkpoints are
    sched.deliver("fleet-events", active("n2"))
    [second] = sched.drain("assignments")
    assert second["attempt_id"] == "j1-2" and second["node"].endswith("/nodes/n2")
    assert second["zone"] == "us-central2-b"
    assert second["checkpoint_gcs_dir"] == first["checkpoint_gcs_dir"] == "gs://ckpt-us-central2/tpuq/jobs/j1/checkpoints"
    assert second["attempt_gcs_dir"] == "gs://ckpt-us-central2/tpuq/jobs/j1/attempts/2"


def test_preemption_budget_spent_fails_the_job_with_the_reason(sched):
    save_fleet(sched.db, fleet_file(retry={"preemptions": 1}), utc(2026, 1, 1))
    running_job(sched)
    sched.deliver("attempt-events", ended("preempted", detail="host lost"))
    job = sched.job("j1")
    # The TPU the attempt was preempted on is quarantined, not handed out again: the retry waits for another.
    assert job["state"] == "pending" and job["preemptions"] == 1
    assert sched.tpu("n1")["quarantined"]
    sched.deliver("fleet-events", active("n2"))
    job = sched.job("j1")
    assert job["state"] == "assigned" and job["attempt"] == 2
    [retry] = [a for a in sched.drain("assignments") if a["attempt_id"] == "j1-2"]
    assert retry["node"].endswith("/nodes/n2")
    sched.deliver("attempt-events", ended("preempted", attempt=2))
    job = sched.job("j1")
    assert job["state"] == "failed" and "max_preemptions=1" in job["reason"]
    assert sched.drain("assignments") == []


def test_infra_failures_have_their_own_budget(sched):
    running_job(sched, max_infra_retries=0, max_preemptions=5)
    sched.deliver("attempt-events", ended("infra_failed", detail="ssh refused"))
    job = sched.job("j1")
    assert job["state"] == "failed" and "max_infra_retries=0" in job["reason"]
    assert sched.tpu("n1")["state"] == "idle"
