"""The scheduler's notifications (issue 36 §3, tpuq.scheduler.notices): what is published on `notifications` when a job
or group ends, an attempt is preempted, or a job waits too long; and nothing when nobody asked."""

from __future__ import annotations

from datetime import timedelta

from tpuq.contracts.messages import CancelRequest, Tick
from tpuq.contracts.notify import Destination, NotifyEvent
from tpuq.runtime.fleetstore import save_fleet
from tpuq.scheduler import handlers, notices

from tests.scheduler.conftest import active, fleet_file, utc
from tests.scheduler.test_attempts import ended, started
from tests.scheduler.test_reconcile import tick_context

HOOK = {"secret": "team-hook", "events": ["succeeded", "failed", "cancelled", "preempted", "pending"],
        "pending_after": "10m"}
FAILED_DETAIL = ("worker 0 exited 4; worker 0: disk 10.0 GiB free of 100.0 GiB\nlast lines of worker 0:\n"
                 "step 10 loss 2.3\nTraceback (most recent call last):\nValueError: boom")


def running(sched, job_id="j1", node="n1", **spec):
    sched.deliver("jobs", {"id": job_id, "tpu": "v4-8", "command": "train", **spec})
    sched.deliver("fleet-events", active(node))
    sched.deliver("attempt-events", started(job_id=job_id, node=node))
    sched.drain("assignments")


def secrets(notice: dict) -> list[str]:
    return [d["secret"] for d in notice["destinations"]]


# ------------------------------------------------------------------------------------------- through handlers


def test_a_failed_job_is_told_once_with_its_reason_and_last_lines_and_again_on_a_redelivery(sched):
    running(sched, notify=[HOOK])
    message = ended("failed", detail=FAILED_DETAIL)
    mid = sched.deliver("attempt-events", message, times=1)
    [notice] = sched.drain("notifications")
    assert notice["event_id"] == "failed:j1" and notice["event"] == "failed" and notice["subject"] == "j1"
    assert notice["title"] == "j1 failed (exit 4)"
    assert notice["text"] == "worker 0 exited 4; worker 0: disk 10.0 GiB free of 100.0 GiB"
    assert notice["lines"] == ["step 10 loss 2.3", "Traceback (most recent call last):", "ValueError: boom"]
    assert secrets(notice) == ["team-hook"] and notice["fields"]["state"] == "failed"
    # Redelivered (say the first delivery crashed after its commit): the job is as it left it; the same event again.
    sched.deliver("attempt-events", message, message_id=mid, times=1)
    assert [n["event_id"] for n in sched.drain("notifications")] == ["failed:j1"]


def test_the_fleets_destinations_hear_every_job_and_each_secret_once(sched):
    save_fleet(sched.db, fleet_file(notify=[{"secret": "team-hook"}, {"secret": "ops"}]), utc(2026, 1, 2))
    running(sched, notify=[HOOK])
    sched.deliver("attempt-events", ended("succeeded"), times=1)
    [notice] = sched.drain("notifications")
    assert notice["title"] == "j1 succeeded" and secrets(notice) == ["team-hook", "ops"] and notice["lines"] == []


def test_a_three_task_group_is_told_once_when_its_last_task_ends_naming_the_failed_one(sched):
    for n in range(3):
        sched.deliver("fleet-events", active(f"n{n}"))
    sched.deliver("jobs", {"id": "tr", "tpu": "v4-8", "command": "train", "array": 3, "notify": [HOOK]})
    node = {m["job_id"]: m["node"].rsplit("/", 1)[1] for m in sched.drain("assignments")}
    assert sorted(node) == ["tr-0", "tr-1", "tr-2"]
    sched.deliver("attempt-events", ended("succeeded", job_id="tr-0", node=node["tr-0"]))
    sched.deliver("attempt-events", ended("failed", job_id="tr-1", node=node["tr-1"], detail=FAILED_DETAIL))
    assert sched.drain("notifications") == []  # no notice per task, and the group has not ended
    sched.deliver("attempt-events", ended("succeeded", job_id="tr-2", node=node["tr-2"]), times=1)
    [notice] = sched.drain("notifications")
    assert notice["event_id"] == "failed:group:tr" and notice["subject"] == "tr"
    assert notice["title"] == "group tr failed: 1 of 3 tasks failed"
    assert "2 succeeded" in notice["text"] and "failed: tr-1: worker 0 exited 4" in notice["text"]
    assert notice["lines"][-1] == "ValueError: boom"
    assert notice["fields"]["failed"] == "1" and notice["fields"]["succeeded"] == "2"


def test_a_groups_last_tasks_ending_at_once_tell_of_the_group_under_one_id(sched):
    from concurrent.futures import ThreadPoolExecutor

    for n in range(2):
        sched.deliver("fleet-events", active(f"n{n}"))
    sched.deliver("jobs", {"id": "tr", "tpu": "v4-8", "command": "train", "array": 2, "notify": [HOOK]})
    node = {m["job_id"]: m["node"].rsplit("/", 1)[1] for m in sched.drain("assignments")}
    ends = [ended("succeeded", job_id=t, node=node[t]) for t in sorted(node)] * 2  # each delivered twice at once
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda e: sched.deliver("attempt-events", e, message_id=e.job_id, times=1), ends))
    told = sched.drain("notifications")
    assert told and {n["event_id"] for n in told} == {"succeeded:group:tr"}
    assert told[0]["title"] == "group tr succeeded: all 2 tasks succeeded"


def test_a_preemption_says_it_is_retried_in_the_same_region(sched):
    running(sched, notify=[HOOK])
    sched.deliver("attempt-events", ended("preempted", detail="spot VM preempted"))  # delivered twice
    notices_ = sched.drain("notifications")
    assert {n["event_id"] for n in notices_} == {"preempted:j1:1"}
    notice = notices_[0]
    assert notice["title"] == "j1 preempted (attempt 1): retried in us-central2"
    assert "where its checkpoints are" in notice["text"] and sched.job("j1")["state"] == "pending"


def test_a_preemption_out_of_budget_says_so_and_the_job_fails(sched):
    running(sched, notify=[HOOK], max_preemptions=0)
    sched.deliver("attempt-events", ended("preempted", detail="spot VM preempted"), times=1)
    by_id = {n["event_id"]: n for n in sched.drain("notifications")}
    assert set(by_id) == {"preempted:j1:1", "failed:j1"}
    assert by_id["preempted:j1:1"]["title"] == "j1 preempted (attempt 1): not retried"
    assert "retry budget spent" in by_id["preempted:j1:1"]["text"]


def test_a_job_pending_past_pending_after_is_told_once_per_spell(sched):
    sched.deliver("jobs", {"id": "j1", "tpu": "v4-8", "command": "train", "notify": [HOOK]})  # asks; none comes
    handlers.on_tick(Tick(seq=1, nudge=True), tick_context(sched, timedelta(minutes=5)))
    assert sched.drain("notifications") == []  # not yet 10 minutes
    handlers.on_tick(Tick(seq=2, nudge=True), tick_context(sched, timedelta(minutes=11)))
    [notice] = sched.drain("notifications")
    assert notice["event_id"] == "pending:j1:0" and notice["title"].startswith("j1 pending for 11m")
    assert notice["text"] == "a capacity request is open: the claimer is racing the fleet's zones for a TPU"
    handlers.on_tick(Tick(seq=3, nudge=True), tick_context(sched, timedelta(minutes=30)))
    assert sched.drain("notifications") == []  # once per spell


def test_cancels_of_pending_and_waiting_jobs_are_told(sched):
    sched.deliver("jobs", {"id": "a", "tpu": "v4-8", "command": "x", "notify": [HOOK]})
    sched.deliver("jobs", {"id": "b", "tpu": "v4-8", "command": "y", "depends_on": ["a"], "notify": [HOOK]})
    sched.deliver("cancels", CancelRequest(job_id="a"))
    by_id = {n["event_id"]: n for n in sched.drain("notifications")}
    assert set(by_id) == {"cancelled:a", "cancelled:b"}
    assert by_id["cancelled:b"]["text"] == "cancelled: dependency a cancelled"


def test_nobody_asked_nothing_is_published(sched):
    running(sched)
    sched.deliver("attempt-events", ended("preempted"))
    sched.deliver("fleet-events", active("n2"))
    sched.deliver("attempt-events", ended("failed", attempt=2, node="n2", detail=FAILED_DETAIL))
    sched.deliver("jobs", {"id": "g", "tpu": "v4-8", "command": "x", "array": 2})
    sched.deliver("cancels", CancelRequest(job_id="g-0"))
    sched.deliver("cancels", CancelRequest(job_id="g-1"))
    handlers.on_tick(Tick(seq=1, nudge=True), tick_context(sched, timedelta(days=2)))
    assert sched.job("j1")["state"] == "failed" and sched.job("g-1")["state"] == "cancelled"
    assert sched.drain("notifications") == []


# ----------------------------------------------------------------------------------------------------- pure


def _job(**fields) -> dict:
    return {"id": "j1", "state": "pending", "attempt": 0, "submit_time": utc(2026, 1, 1),
            "spec": {"notify": [HOOK]}, **fields}


def test_split_reason_keeps_what_failed_and_the_last_lines():
    assert notices.split_reason(FAILED_DETAIL)[1][-1] == "ValueError: boom"
    assert notices.split_reason("setup failed: worker 0: no bundle") == ("setup failed: worker 0: no bundle", [])


def test_a_group_fails_if_one_failed_else_is_cancelled_if_one_was():
    assert notices.group_outcome({"succeeded": 2, "cancelled": 1, "failed": 1}) is NotifyEvent.failed
    assert notices.group_outcome({"succeeded": 2, "cancelled": 1}) is NotifyEvent.cancelled
    assert notices.group_outcome({"succeeded": 3}) is NotifyEvent.succeeded


def test_pending_is_told_to_each_destination_at_its_own_threshold_once():
    slow = {"secret": "slow", "events": ["pending"], "pending_after": "2h"}
    job = _job(spec={"notify": [HOOK, slow]})
    notice, marker, due = notices.pending_notice(job, None, utc(2026, 1, 1, 0, 20))
    assert notice is not None and secrets(notice.model_dump()) == ["team-hook"] and due == utc(2026, 1, 1, 2)
    job |= marker
    assert notices.pending_notice(job, None, utc(2026, 1, 1, 1))[0] is None
    notice, marker, due = notices.pending_notice(job, None, utc(2026, 1, 1, 3))
    assert secrets(notice.model_dump()) == ["slow"] and notice.event_id == "pending:j1:0" and due is None
    # A new spell (attempt 1 went back to the queue): told again, under the new attempt's id.
    job |= {"attempt": 1, "pending_since": utc(2026, 1, 2)}
    notice, _, _ = notices.pending_notice(job, None, utc(2026, 1, 2, 0, 15))
    assert notice.event_id == "pending:j1:1"


def test_jobs_waiting_by_design_are_not_told_of():
    assert notices.pending_notice(_job(waiting="waiting for a (running)"), None, utc(2026, 1, 2))[0] is None
    held = _job(group="tr", array_limit=2, blocked=notices.grouplimit.held_reason("tr", 2))
    assert notices.pending_notice(held, None, utc(2026, 1, 2))[0] is None


def test_a_rejected_job_is_told_as_failed_and_an_unasked_one_not_at_all():
    notice = notices.ended_notice(_job(state="rejected", reason="cannot run: no bucket"), None, utc(2026, 1, 1))
    assert notice.event is NotifyEvent.failed and notice.title == "j1 rejected"
    fleet = [Destination(secret="ops", events=["succeeded"])]
    assert notices.ended_notice(_job(state="failed", spec={}), fleet, utc(2026, 1, 1)) is None


def test_a_job_stopped_at_its_max_duration_says_so_in_the_title():
    reason = "timed out after 2h (max_duration): worker 0 stopped\nlast lines of worker 0:\nstep 900"
    notice = notices.ended_notice(_job(state="failed", reason=reason), None, utc(2026, 1, 1))
    assert notice.title == "j1 failed (timed out after 2h)" and notice.lines == ["step 900"]
