"""`depends_on` (issue 36 §2): a pipeline runs in order, a waiting job holds no TPU and asks for no capacity, a
failed dependency cancels its waiters down the chain with the reason, `{any: [...]}` runs after a failure, and a
cycle or an unknown id is refused naming the field."""

from __future__ import annotations

from tpuq.contracts import store
from tpuq.contracts.messages import CancelRequest

from tests.scheduler.conftest import active
from tests.scheduler.test_attempts import ended, started

V4 = {"tpu": "v4-8"}
PIPELINE = {"jobs": [
    {"id": "prepare", **V4, "command": "prep"},
    {"id": "train", **V4, "command": "train", "depends_on": ["prepare"]},
    {"id": "eval", **V4, "command": "eval", "depends_on": ["train"]},
]}


def asked_for(sched) -> set[str]:
    return {j for m in sched.drain("capacity") if m.get("action", "request") == "request" for j in m["job_ids"]}


def run(sched, job_id: str, outcome: str, node: str = "n1") -> None:
    """The job (assigned to `node`) starts and ends with `outcome`."""
    assert sched.job(job_id)["state"] == "assigned", sched.job(job_id)
    sched.deliver("attempt-events", started(job_id, node=node))
    sched.deliver("attempt-events", ended(outcome, job_id=job_id, node=node))


def test_a_pipeline_runs_in_order_and_waiting_jobs_hold_no_tpu_and_ask_for_none(sched):
    sched.deliver("jobs", PIPELINE)
    # Only prepare asks for capacity; the others wait, saying for what.
    assert asked_for(sched) == {"prepare"}
    train, evaluation = sched.job("train"), sched.job("eval")
    assert train["state"] == "pending" and train["waiting"] == "waiting for prepare (pending)"
    assert evaluation["waiting"] == "waiting for train (pending)"
    assert not train.get("capacity_request") and not evaluation.get("capacity_request")
    assert train["depends_on_ids"] == ["prepare"]

    sched.deliver("fleet-events", active("n1"))  # one idle TPU: prepare gets it, the waiting jobs do not
    assert sched.job("prepare")["state"] == "assigned"
    assert sched.job("train")["state"] == "pending" and sched.job("eval")["state"] == "pending"
    sched.deliver("fleet-events", active("n2"))  # a second idle TPU stays idle: nobody waiting may take it
    assert sched.tpu("n2")["state"] == "idle" and sched.job("train")["state"] == "pending"
    assert asked_for(sched) == set()

    run(sched, "prepare", "succeeded")
    assert sched.job("train")["state"] == "assigned" and not sched.job("train").get("waiting")
    node = sched.job("train")["tpu"].rsplit("/", 1)[1]
    sched.deliver("attempt-events", started("train", node=node))
    # The reason follows the dependency's state when it changes (the start is looked at, as an end is).
    assert sched.job("eval")["state"] == "pending" and sched.job("eval")["waiting"] == "waiting for train (running)"
    sched.deliver("attempt-events", ended("succeeded", job_id="train", node=node))
    assert sched.job("eval")["state"] == "assigned"


def test_a_failed_dependency_cancels_its_waiter_and_the_waiter_s_waiter(sched):
    sched.deliver("jobs", PIPELINE)
    sched.deliver("fleet-events", active("n1"))
    run(sched, "prepare", "failed")
    train, evaluation = sched.job("train"), sched.job("eval")
    assert train["state"] == "cancelled" and train["reason"] == "cancelled: dependency prepare failed"
    assert evaluation["state"] == "cancelled" and evaluation["reason"] == "cancelled: dependency train cancelled"
    assert sched.tpu("n1")["state"] == "idle"  # nothing ran in their stead


def test_a_cancelled_pending_dependency_cancels_its_waiters(sched):
    sched.deliver("jobs", PIPELINE)
    sched.deliver("cancels", CancelRequest(job_id="prepare", reason="wrong data"))
    assert sched.job("train")["reason"] == "cancelled: dependency prepare cancelled"
    assert sched.job("eval")["state"] == "cancelled"
    assert not sched.job("train")["waiting"] and not sched.job("eval")["waiting"]  # no stale "waiting for"


def test_a_waiting_job_cancelled_by_its_user_no_longer_says_it_waits(sched):
    sched.deliver("jobs", PIPELINE)
    assert sched.job("eval")["waiting"]
    sched.deliver("cancels", CancelRequest(job_id="eval", reason="not needed"))
    job = sched.job("eval")
    assert job["state"] == "cancelled" and job["reason"] == "not needed" and not job["waiting"]


def test_any_runs_after_a_failure(sched):
    sched.deliver("jobs", {"jobs": [
        {"id": "train", **V4, "command": "train"},
        {"id": "report", **V4, "command": "report", "depends_on": {"any": ["train"]}},
    ]})
    sched.deliver("fleet-events", active("n1"))
    run(sched, "train", "failed")
    assert sched.job("report")["state"] == "assigned"


def test_a_job_may_depend_on_a_stored_job_of_an_earlier_submission(sched):
    sched.deliver("jobs", {"id": "prepare", **V4, "command": "prep"})
    sched.deliver("jobs", {"id": "train", **V4, "command": "train", "depends_on": ["prepare"]})
    assert sched.job("train")["state"] == "pending" and sched.job("train")["waiting"]
    assert sched.all(store.DEAD_LETTERS) == {}


def test_an_unknown_id_is_refused_naming_the_field(sched):
    sched.deliver("jobs", {"id": "train", **V4, "command": "train", "depends_on": ["prepare"]}, message_id="m1")
    job = sched.job("train")
    assert job["state"] == "rejected" and job["reason"].startswith("depends_on[0]: ")
    assert "'prepare'" in job["reason"]
    sched.deliver("jobs", {"jobs": [{"id": "a", **V4, "command": "a"},
                                    {"id": "b", **V4, "command": "b", "depends_on": {"any": ["a", "nope"]}}]},
                  message_id="m2")
    letter = next(d for d in sched.all(store.DEAD_LETTERS).values() if d["message_id"] == "m2")
    assert letter["field"] == "jobs[1].depends_on.any[1]" and "'nope'" in letter["reason"]
    assert "a" not in sched.all(store.JOBS) and "b" not in sched.all(store.JOBS)  # nothing of the file


def test_a_cycle_is_refused_naming_the_field(sched):
    sched.deliver("jobs", {"jobs": [{"id": "a", **V4, "command": "a", "depends_on": ["c"]},
                                    {"id": "b", **V4, "command": "b", "depends_on": ["a"]},
                                    {"id": "c", **V4, "command": "c", "depends_on": ["b"]}]}, message_id="m3")
    [letter] = sched.all(store.DEAD_LETTERS).values()
    assert letter["field"].startswith("jobs[") and ".depends_on[0]" in letter["field"]
    assert "cycle" in letter["reason"]
    assert sched.all(store.JOBS) == {}


def test_a_job_after_a_group_waits_for_every_task_and_is_cancelled_naming_the_failed_one(sched):
    """`depends_on: [train]` where train is an array: met when all its tasks succeeded; one failed cancels it."""
    sched.deliver("jobs", {"jobs": [{"id": "train", **V4, "command": "train", "array": 2},
                                    {"id": "eval", **V4, "command": "eval", "depends_on": ["train"]}]})
    assert sched.job("eval")["waiting"] == "waiting for train-0 (pending)"  # a group: one task not done named
    assert asked_for(sched) == {"train-0", "train-1"}
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("fleet-events", active("n2"))
    nodes = {j: sched.job(j)["tpu"].rsplit("/", 1)[1] for j in ("train-0", "train-1")}
    run(sched, "train-0", "succeeded", node=nodes["train-0"])
    assert sched.job("eval")["state"] == "pending"
    run(sched, "train-1", "failed", node=nodes["train-1"])
    evaluation = sched.job("eval")
    assert evaluation["state"] == "cancelled" and evaluation["reason"] == "cancelled: dependency train-1 failed"


def test_a_long_pipeline_waiting_at_the_head_of_the_queue_hides_no_job_behind_it(sched):
    """More waiting jobs ahead than a pass reads per type (PER_TYPE_EXTRA): it reads on past them."""
    from tpuq.scheduler.passreads import PER_TYPE_EXTRA

    sched.deliver("jobs", {"id": "prepare", **V4, "command": "prep"})
    sched.deliver("jobs", {"id": "sweep", **V4, "command": "train", "priority": "high",
                           "array": PER_TYPE_EXTRA + 8, "depends_on": ["prepare"]})
    assert sched.job("sweep-0")["waiting"] == "waiting for prepare (pending)"
    sched.deliver("fleet-events", active("n1"))  # a full pass: the idle TPU goes to prepare, behind the sweep
    assert sched.job("prepare")["state"] == "assigned"


def test_a_dependency_failed_by_its_slice_s_loss_cancels_its_waiters_at_once(sched):
    """A job can end other than by its attempt's event: out of retries when its slice is lost."""
    from tpuq.contracts.messages import FleetEventKind

    pipeline = {"jobs": [{**PIPELINE["jobs"][0], "retry_on_infrastructure_failure": False}, *PIPELINE["jobs"][1:]]}
    sched.deliver("jobs", pipeline)
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("attempt-events", started("prepare"))
    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.suspended))
    assert sched.job("prepare")["state"] == "failed"
    assert sched.job("train")["reason"] == "cancelled: dependency prepare failed"
    assert sched.job("eval")["reason"] == "cancelled: dependency train cancelled"
