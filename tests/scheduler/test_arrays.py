"""Arrays and sweeps at the scheduler (issue 36 §1): one message stored as its tasks, all or nothing, once; a group's
`%K` holds back its tasks past the limit. On the in-memory harness; every message is delivered twice."""

from __future__ import annotations

from tpuq.contracts import store

from tests.helpers import push_envelope
from tests.scheduler.conftest import active
from tests.scheduler.test_attempts import ended


def spec(job_id: str | None = "tr", **kw) -> dict:
    return {**({"id": job_id} if job_id else {}), "tpu": "v4-8", "command": "python train.py", **kw}


def stored_jobs(sched) -> dict[str, dict]:
    return sched.all(store.JOBS)


def test_a_sweep_is_stored_as_its_tasks_with_their_values_once(sched):
    sched.deliver("jobs", spec(sweep={"LR": [1e-3, 3e-4], "SEED": [0, 1, 2]}, env={"DATA": "gs://d"}))
    jobs = stored_jobs(sched)
    assert sorted(jobs) == [f"tr-{i}" for i in range(6)]  # the group's own id is no job
    envs = [jobs[f"tr-{i}"]["spec"]["env"] for i in range(6)]
    assert envs[0] == {"DATA": "gs://d", "LR": "0.001", "SEED": "0"}
    assert [(e["LR"], e["SEED"]) for e in envs] == [("0.001", "0"), ("0.001", "1"), ("0.001", "2"),
                                                     ("0.0003", "0"), ("0.0003", "1"), ("0.0003", "2")]
    t = jobs["tr-4"]
    assert (t["group"], t["array_index"], t["array_size"], t["array_limit"]) == ("tr", 4, 6, None)
    assert t["state"] == "pending" and t["spec"]["id"] == "tr-4" and "sweep" not in t["spec"]


def test_a_redelivered_array_stores_nothing_new_and_a_taken_task_id_refuses_the_whole(sched):
    mid = sched.deliver("jobs", spec(array=3))
    before = stored_jobs(sched)
    sched.deliver("jobs", spec(array=3), message_id=mid)
    assert stored_jobs(sched) == before
    sched.deliver("jobs", spec("solo"))
    sched.deliver("jobs", spec("so", array=3))  # `so-...` free: stored
    # Another submission whose task tr-1 is taken: refused (dead-lettered), none of its tasks stored.
    sched.deliver("jobs", spec("tr", array="0-5"), times=1)
    jobs = stored_jobs(sched)
    assert sorted(j for j in jobs if j.startswith("tr-")) == ["tr-0", "tr-1", "tr-2"]
    # The refusal is recorded where `tpuq status tr` finds it (the push adapter's record of a refused submission).
    assert jobs["tr"]["state"] == "rejected" and "nothing of this group was stored" in jobs["tr"]["reason"]


def test_a_thousand_tasks_are_stored_in_commits_of_at_most_500_and_a_crash_is_completed(sched, monkeypatch):
    from tpuq.scheduler import arrays

    commits: list[int] = []
    real_batch = sched.db.batch

    class Counted:
        def __init__(self):
            self.inner, self.n = real_batch(), 0

        def create(self, ref, doc):
            self.n += 1
            self.inner.create(ref, doc)

        def __getattr__(self, name):  # the pass's guarded updates go through unchanged
            return getattr(self.inner, name)

        def commit(self):
            if self.n:  # the group's creates
                assert self.n <= arrays.MAX_WRITES_PER_COMMIT
                commits.append(self.n)
                if crash and len(commits) == 2:
                    raise RuntimeError("instance stopped between two commits")
            return self.inner.commit()

    monkeypatch.setattr(sched.db, "batch", Counted)
    crash = True
    r = sched.client.post("/push/jobs", json=push_envelope(spec("big", array=1000), "m-big", "scheduler-jobs"))
    assert r.status_code == 500  # not acked: Pub/Sub delivers it again
    assert len(stored_jobs(sched)) == 500
    crash = False
    sched.deliver("jobs", spec("big", array=1000), message_id="m-big", times=1)  # the redelivery completes it
    jobs = stored_jobs(sched)
    assert len(jobs) == 1000 and jobs["big-999"]["array_size"] == 1000
    assert commits == [500, 500, 500]


def test_at_most_k_tasks_of_a_group_hold_a_tpu_and_the_next_starts_when_one_ends(sched):
    for n in range(6):
        sched.deliver("fleet-events", active(f"n{n}"))
    sched.deliver("jobs", spec(array="0-5%2"))
    jobs = stored_jobs(sched)
    on_tpu = sorted(j for j, d in jobs.items() if d["state"] == "assigned")
    assert on_tpu == ["tr-0", "tr-1"]
    held = jobs["tr-2"]
    assert held["state"] == "pending" and "at most 2 of its tasks run at once" in held["blocked"]
    assert not any(d.get("capacity_request") for d in jobs.values())  # held tasks ask for no capacity
    [first, second] = sorted(sched.drain("assignments"), key=lambda m: m["job_id"])
    assert (first["array_index"], first["array_size"]) == (0, 6)
    # tr-0 ends: exactly one more (tr-2) is assigned.
    node = jobs["tr-0"]["tpu"].rsplit("/", 1)[1]
    sched.deliver("attempt-events", ended("succeeded", job_id="tr-0", node=node))
    jobs = stored_jobs(sched)
    assert sorted(j for j, d in jobs.items() if d["state"] == "assigned") == ["tr-1", "tr-2"]
    assert jobs["tr-0"]["state"] == "succeeded"


def test_a_long_limited_group_hides_no_job_queued_behind_it(sched):
    """A pass reads a bounded page of each type's pending jobs (idle TPUs + PER_TYPE_EXTRA). A group's held tasks
    must not fill it: the job submitted after a 200-task group with %2 gets the next TPU."""
    sched.deliver("fleet-events", active("n0"))
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("jobs", spec(array="0-199%2"))
    sched.deliver("jobs", spec("other"))
    assert sched.job("other")["state"] == "pending"
    sched.deliver("fleet-events", active("n2"))  # its full pass reads the queue from the front
    assert sched.job("other")["state"] == "assigned"
    assert sum(d["state"] == "assigned" for d in stored_jobs(sched).values()) == 3
