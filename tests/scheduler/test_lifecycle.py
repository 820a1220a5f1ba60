"""The pure decisions behind the handlers, without a stack: what each event writes, and when it writes nothing."""

from __future__ import annotations

import random

from tpuq.contracts.fleet import RetryBudgets
from tpuq.contracts.messages import AttemptOutcome, FleetEventKind
from tpuq.scheduler import lifecycle
from tpuq.scheduler.plan import Match

from tests.scheduler.conftest import active, utc

NOW = utc(2026, 1, 1)
NODE = "projects/tpuq-local/locations/us-central2-b/nodes/n1"
MATCH = Match("j1", NODE, "v4-8", "us-central2-b", "us-central2", "v4")


def stored_job(**kw) -> dict:
    return {"id": "j1", "state": "pending", "spec": {"id": "j1", "tpu": ["v4-8"], "command": "x"}, "attempt": 0,
            "preemptions": 0, "infra_failures": 0, **kw}


def idle_tpu(**kw) -> dict:
    return {"name": NODE, "state": "idle", "request_id": None, "endpoints": [], **kw}


def test_active_never_resets_a_busy_tpu_and_never_revives_a_gone_one():
    fresh = lifecycle.tpu_on_active(None, active("n1"), None, NOW)
    busy = {**fresh, "state": "busy", "job_id": "j1", "attempt_id": "j1-1"}
    assert lifecycle.tpu_on_active(busy, active("n1"), None, NOW) is None
    assert lifecycle.tpu_on_active({**fresh, "state": "gone"}, active("n1"), None, NOW) is None
    assert lifecycle.tpu_on_gone({**fresh, "state": "gone"}, active("n1", kind=FleetEventKind.gone), NOW) is None


def test_only_the_attempt_that_holds_a_tpu_frees_it():
    busy = idle_tpu(state="busy", attempt_id="j1-2")
    assert lifecycle.tpu_freed(busy, "j1-1", NOW) is None  # a stale attempt
    assert lifecycle.tpu_freed({**busy, "state": "gone"}, "j1-2", NOW) is None
    assert lifecycle.tpu_freed(busy, "j1-2", NOW)["state"] == "idle"
    assert not lifecycle.tpu_freed(busy, "j1-2", NOW).get("quarantined")
    suspect = lifecycle.tpu_freed(busy, "j1-2", NOW, "attempt j1-2 ended infra_failed")
    assert suspect["quarantined"] and "infra_failed" in suspect["quarantine_reason"]


def test_assignment_needs_a_pending_job_and_an_idle_tpu():
    assert lifecycle.assignment(stored_job(state="assigned"), idle_tpu(), MATCH, "tpuq-runner", NOW) is None
    assert lifecycle.assignment(stored_job(), idle_tpu(state="deleting"), MATCH, "tpuq-runner", NOW) is None
    writes = lifecycle.assignment(stored_job(attempt=2), idle_tpu(), MATCH, "tpuq-runner", NOW)
    assert writes.job["attempt"] == 3 and writes.job["attempt_id"] == "j1-3" and writes.tpu["state"] == "busy"


def test_retry_keeps_the_checkpoints_of_the_pinned_region():
    job = stored_job(attempt=1, pinned_region="us-central2", checkpoint_gcs_dir="gs://old/tpuq/jobs/j1/checkpoints")
    writes = lifecycle.assignment(job, idle_tpu(), MATCH, "tpuq-runner", NOW)
    assert writes.message.checkpoint_gcs_dir == "gs://old/tpuq/jobs/j1/checkpoints"


def test_the_assignment_says_how_many_preemptions_and_whether_an_earlier_attempt_started():
    """TPUQ_PREEMPTIONS and TPUQ_RESUMING come from the job document, in the assignment and in its republish."""
    first = lifecycle.assignment(stored_job(), idle_tpu(), MATCH, "tpuq-runner", NOW).message
    assert (first.attempt, first.preemptions, first.resuming) == (1, 0, False)
    never_started = stored_job(attempt=1, infra_failures=1, assigned_at=utc(2025, 12, 31))  # infra_failed unstarted
    assert lifecycle.assignment(never_started, idle_tpu(), MATCH, "tpuq-runner", NOW).message.resuming is False
    ran = stored_job(attempt=2, preemptions=2, assigned_at=utc(2025, 12, 30), started_at=utc(2025, 12, 31))
    message = lifecycle.assignment(ran, idle_tpu(), MATCH, "tpuq-runner", NOW).message
    assert (message.attempt, message.preemptions, message.resuming) == (3, 2, True)
    # Sent again while assigned: an earlier start is older than the current assignment; none is not.
    again = {**ran, "state": "assigned", "attempt": 3, "attempt_id": "j1-3", "tpu": NODE, "zone": "us-central2-b",
             "assigned_at": NOW}
    assert lifecycle.assignment_message(again, [], NOW).resuming is True
    fresh = {**stored_job(), "state": "assigned", "attempt": 1, "attempt_id": "j1-1", "tpu": NODE,
             "zone": "us-central2-b", "assigned_at": NOW}
    assert lifecycle.assignment_message(fresh, [], NOW).resuming is False


def test_withdraw_only_a_request_this_tpu_did_not_serve():
    job = stored_job(capacity_request={"id": "r-j1-1"})
    assert lifecycle.assignment(job, idle_tpu(request_id="r-j1-1"), MATCH, "b", NOW).withdraw_request_id is None
    assert lifecycle.assignment(job, idle_tpu(), MATCH, "b", NOW).withdraw_request_id == "r-j1-1"


def test_attempt_end_counts_once_and_only_for_the_current_attempt():
    job = stored_job(state="running", attempt=2, region="us-central2")
    rng = random.Random(1)
    budgets = RetryBudgets(backoff_base_seconds=10)
    assert lifecycle.attempt_ended(job, 1, AttemptOutcome.preempted, None, budgets, NOW, rng).job is None
    end = lifecycle.attempt_ended(job, 2, AttemptOutcome.preempted, None, budgets, NOW, rng)
    assert end.job["state"] == "pending" and end.job["preemptions"] == 1 and end.job["pinned_region"] == "us-central2"
    assert end.job["not_before"] > NOW  # backing off
    requeued = {**job, **end.job}
    assert lifecycle.attempt_ended(requeued, 2, AttemptOutcome.preempted, None, budgets, NOW, rng).job is None


def test_cancel_decisions():
    assert lifecycle.cancel(stored_job(state="succeeded"), "r", NOW).job is None
    pending = lifecycle.cancel(stored_job(capacity_request={"id": "r-j1-1"}), "r", NOW)
    assert pending.job["state"] == "cancelled" and pending.withdraw_request_id == "r-j1-1"
    running = lifecycle.cancel(stored_job(state="running"), "r", NOW)
    assert running.stop_attempt and running.job == {"cancel_requested": True, "cancel_reason": "r", "updated_at": NOW}
    again = lifecycle.cancel(stored_job(state="running", cancel_requested=True), "r", NOW)
    assert again.stop_attempt and again.job is None
