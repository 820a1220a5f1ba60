"""A whole `jobs:` file published as one message on `jobs`: every job in it is stored, under deterministic ids, and
a redelivery stores nothing new; a file with an id another submission holds stores nothing and is a dead letter."""

from __future__ import annotations

from tpuq.contracts import store

FILE = {"jobs": [{"name": "train", "tpu": "v4-8", "command": "python train.py"},
                 {"id": "eval-1", "tpu": "v4-8", "command": "python eval.py", "priority": "high"}]}


def test_every_job_of_a_file_is_stored_once_under_redelivery(sched):
    mid = sched.deliver("jobs", FILE, message_id="4242", times=2)
    jobs = sched.all(store.JOBS)
    assert sorted(jobs) == ["eval-1", f"job-{mid}-0"]
    assert {j["state"] for j in jobs.values()} == {"pending"}
    assert {j["message_id"] for j in jobs.values()} == {mid}
    assert jobs["eval-1"]["priority"] == "high"
    assert sched.all(store.DEAD_LETTERS) == {}


def test_a_file_reusing_a_stored_id_stores_nothing_and_says_which(sched):
    sched.deliver("jobs", {"id": "eval-1", "tpu": "v4-8", "command": "x"}, message_id="1")
    sched.deliver("jobs", FILE, message_id="2", times=2)
    assert sorted(sched.all(store.JOBS)) == ["eval-1"]  # not job-2-0 either: all or nothing
    [letter] = sched.all(store.DEAD_LETTERS).values()
    assert letter["message_id"] == "2" and letter["field"] == "jobs[1].id"
    assert "already used by another submission" in letter["reason"]


def test_a_local_bundle_path_in_a_pasted_file_is_refused_with_the_hint(sched):
    sched.deliver("jobs", {"jobs": [{"tpu": "v4-8", "command": "x", "bundle": "."}]}, message_id="3")
    [letter] = sched.all(store.DEAD_LETTERS).values()
    assert letter["field"] == "jobs[0].bundle"
    assert "tpuq submit job.yaml" in letter["reason"] and "gs://" in letter["reason"]
    assert sched.all(store.JOBS) == {}


def test_a_misspelt_field_is_refused_with_the_field_it_likely_meant(sched):
    """Published past `tpuq submit` (gcloud, a script): the dead letter names the unknown field and the one meant."""
    sched.deliver("jobs", {"tpu": "v4-8", "comand": "python train.py"}, message_id="5")
    sched.deliver("jobs", {"jobs": [{"tpu": "v4-8", "command": "x", "priorty": "high"}]}, message_id="6")
    letters = {letter["message_id"]: letter for letter in sched.all(store.DEAD_LETTERS).values()}
    assert "did you mean `command`?" in letters["5"]["reason"]
    assert letters["6"]["field"] == "jobs[0].priorty" and "did you mean `priority`?" in letters["6"]["reason"]
    assert sched.all(store.JOBS) == {}
