"""`depends_on` (issue 36 §2) without a scheduler: the spec's refusals name the field, a cycle in a file is refused,
the verdict on a dependency's states, and `tpuq submit`'s checks before it publishes."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from tpuq.contracts import store
from tpuq.contracts.errors import describe_validation_error
from tpuq.contracts.jobspec import JobFile, JobSpec, PublishedJob, PublishedJobFile
from tpuq.operations.submit import PreparedJob, submit_prepared, unknown_dependencies
from tpuq.scheduler.dependencies import Needs, judge, needs_of
from tpuq_dev.inmemory import MemoryFirestore

JOB = {"tpu": "v4-8", "command": "x"}


def refusal(model, data) -> tuple[str, str]:
    with pytest.raises(ValidationError) as e:
        model.model_validate(data)
    return describe_validation_error(e.value)


@pytest.mark.parametrize("depends_on, field, words", [
    (["prepare", "Bad"], "depends_on[1]", "not a job or group id"),
    (["a", "a"], "depends_on[1]", "named twice"),
    ({"any": ["a", "b c"]}, "depends_on.any[1]", "not a job or group id"),
    ({"all": ["a"]}, "depends_on", "one key, `any`"),
    ("prepare", "depends_on", "a list"),
    ([], "depends_on", "non-empty"),
    (["self"], "depends_on[0]", "itself"),
])
def test_a_bad_depends_on_is_refused_naming_the_entry(depends_on, field, words):
    where, reason = refusal(PublishedJob, {**JOB, "id": "self", "depends_on": depends_on})
    assert where == field and words in reason


def test_a_group_waiting_for_its_own_task_is_refused():
    where, reason = refusal(PublishedJob, {**JOB, "id": "train", "array": 4, "depends_on": ["prep", "train-2"]})
    assert where == "depends_on[1]" and "a task of this group" in reason
    PublishedJob.model_validate({**JOB, "id": "train", "array": 4, "depends_on": ["train-data"]})


def test_a_list_and_any_are_kept_as_given():
    assert PublishedJob.model_validate({**JOB, "depends_on": ["a", "b"]}).model_dump(mode="json")["depends_on"] == \
        ["a", "b"]
    stored = PublishedJob.model_validate({**JOB, "depends_on": {"any": ["a"]}}).model_dump(mode="json")
    assert stored["depends_on"] == {"any": ["a"]} and needs_of(stored) == Needs(("a",), any_end=True)


@pytest.mark.parametrize("model", [JobFile, PublishedJobFile])
def test_a_cycle_in_a_file_is_refused_naming_the_entry_that_closes_it(model):
    where, reason = refusal(model, {"jobs": [{**JOB, "id": "a", "depends_on": ["c"]},
                                             {**JOB, "id": "b", "depends_on": ["a"]},
                                             {**JOB, "id": "c", "depends_on": ["b"]}]})
    assert where.startswith("jobs[") and where.endswith("].depends_on[0]") and "cycle" in reason


def test_a_pipeline_file_is_valid():
    JobFile.model_validate({"jobs": [{**JOB, "id": "prepare"}, {**JOB, "id": "train", "depends_on": ["prepare"]},
                                     {**JOB, "id": "eval", "depends_on": {"any": ["train", "prepare"]}}]})


def test_the_verdict():
    need = Needs(("prep", "train"), any_end=False)
    assert judge(need, {"prep": [("prep", "succeeded")], "train": [("train-0", "succeeded"),
                                                                    ("train-1", "succeeded")]}).met
    waiting = judge(need, {"prep": [("prep", "succeeded")], "train": [("train-0", "running"),
                                                                      ("train-1", "pending")]})
    assert waiting.waiting == "waiting for train-0 (running) and 1 more" and not waiting.met
    assert judge(need, {"prep": [("prep", "succeeded")], "train": [("train-0", "succeeded"),
                                                                   ("train-1", "failed")]}).never == \
        "dependency train-1 failed"
    assert judge(need, {"prep": []}).waiting == "waiting for prep (not stored yet) and 1 more"
    anyway = Needs(("train",), any_end=True)
    assert judge(anyway, {"train": [("train", "failed")]}).met
    assert judge(anyway, {"train": [("train", "running")]}).waiting == "waiting for train (running)"


def _prepared(**specs) -> list[PreparedJob]:
    return [PreparedJob(JobSpec.model_validate({**JOB, "id": i, **s}), None, []) for i, s in specs.items()]


def test_submit_refuses_a_name_neither_in_the_file_nor_stored():
    db = MemoryFirestore(project="p")
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    db.collection(store.JOBS).document("stored").set({"id": "stored", "state": "succeeded", "submit_time": now})
    db.collection(store.JOBS).document("sweep-0").set({"id": "sweep-0", "state": "running", "group": "sweep"})
    prepared = _prepared(a={}, b={"depends_on": ["a", "stored", "sweep"]}, c={"depends_on": {"any": ["a", "gone"]}})
    assert unknown_dependencies(db, prepared) == [
        "jobs[2].depends_on.any[1]: no job or group 'gone' is stored or in this file"]


class _Publisher:
    def __init__(self):
        self.messages = []

    def publish(self, topic, message, **attributes):
        self.messages.append((topic, message))


def test_jobs_that_depend_on_each_other_travel_as_one_message():
    """Pub/Sub keeps no order between messages: train must not reach the scheduler before prepare is stored."""
    clients = _Publisher()
    ids = submit_prepared(clients, _prepared(prepare={}, train={"depends_on": ["prepare"]}))
    [(topic, message)] = clients.messages
    assert ids == ["prepare", "train"] and topic == "jobs" and isinstance(message, PublishedJobFile)
    assert [j.id for j in message.jobs] == ["prepare", "train"]
    apart = _Publisher()
    submit_prepared(apart, _prepared(one={}, two={}))
    assert [type(m) for _, m in apart.messages] == [PublishedJob, PublishedJob]


def test_a_job_waiting_for_its_dependencies_is_held_and_says_so():
    """The liveness rule counts the scheduler's `waiting` as a stated reason (not "a tpuq bug"), and the list
    shows it as the scheduler wrote it."""
    from datetime import timedelta

    from tpuq.cli.views import job_table_rows
    from tpuq.contracts.documents import JobDoc
    from tpuq.contracts.liveness import nothing_holds

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    doc = {"id": "eval", "state": "pending", "submit_time": now - timedelta(hours=1),
           "updated_at": now - timedelta(hours=1), "waiting": "waiting for train-3 (running)"}
    assert nothing_holds(JobDoc.from_doc(doc), set(), now) is None
    assert nothing_holds(JobDoc.from_doc({**doc, "waiting": None}), set(), now)
    [row] = job_table_rows([doc], now)
    assert row[-1] == "waiting for train-3 (running)"
