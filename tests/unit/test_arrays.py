"""`array:` / `sweep:` / `max_running:` (issue 36 §1): what a group's spec means, and each refusal naming its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tpuq.contracts.arrays import MAX_ARRAY_TASKS, group_tasks, parse_array
from tpuq.contracts.errors import describe_validation_error
from tpuq.contracts.jobspec import ARRAY_ENV, JobFile, JobSpec
from tpuq.executor.workerspec import AttemptPlan, WorkerSettings
from tpuq.scheduler.grouplimit import hold_back
from tpuq.contracts.documents import JobDoc, JobState

from tests.executor.factories import make_assignment


def job(**kw) -> dict:
    return {"tpu": "v4-8", "command": "python train.py", **kw}


@pytest.mark.parametrize("value, indices, limit", [
    (3, (0, 1, 2), None),
    ("0-15", tuple(range(16)), None),
    ("0-99%8", tuple(range(100)), 8),
    ("1,3,5", (1, 3, 5), None),
    ("0-6:3,10", (0, 3, 6, 10), None),
    ("7", (7,), None),  # a string is Slurm's: the one task 7
])
def test_array_values_as_slurm_reads_them(value, indices, limit):
    shape = parse_array(value)
    assert (shape.indices, shape.limit) == (indices, limit)


def field_and_reason(data: dict) -> tuple[str, str]:
    with pytest.raises(ValidationError) as e:
        JobFile.model_validate({"jobs": [data]})
    return describe_validation_error(e.value)


@pytest.mark.parametrize("data, field, words", [
    (job(array=0), "jobs[0].array", "at least 1 task"),
    (job(array=MAX_ARRAY_TASKS + 1), "jobs[0].array", "at most 1,000"),
    (job(array="0-1999"), "jobs[0].array", "at most 1,000"),
    (job(array="5-2"), "jobs[0].array", "FIRST <= LAST"),
    (job(array="0-9%0"), "jobs[0].array", "%1 or more"),
    (job(array="1,1"), "jobs[0].array", "twice"),
    (job(array=True), "jobs[0].array", "is not a number of tasks"),
    (job(array=2, sweep={"LR": [1]}), "jobs[0].array", "not both"),
    (job(sweep={"JOB_ID": [1]}), "jobs[0].sweep", "the runner sets it"),
    (job(sweep={"TPUQ_ARRAY_INDEX": [1]}), "jobs[0].sweep", "belong to tpuq"),
    (job(sweep={"1X": [1]}), "jobs[0].sweep", "not a valid environment variable name"),
    (job(sweep={"LR": []}), "jobs[0].sweep", "non-empty list"),
    (job(sweep={"LR": [1, "1"]}), "jobs[0].sweep", "given twice"),
    (job(sweep={"LR": [1]}, env={"LR": "2"}), "jobs[0].sweep", "also in env"),
    (job(sweep={"A": list(range(40)), "B": list(range(30))}), "jobs[0].sweep", "1,200 combinations"),
    (job(max_running=2), "jobs[0].max_running", "with array or sweep"),
    (job(array="0-9%2", max_running=3), "jobs[0].max_running", "disagree"),
    (job(id="a" * 62, array=10), "jobs[0].id", "at most 61"),
])
def test_each_refusal_names_its_field(data, field, words):
    got_field, reason = field_and_reason(data)
    assert got_field == field and words in reason, (got_field, reason)


def test_a_sweep_is_the_product_in_a_stable_order_with_values_as_strings():
    spec = JobSpec.model_validate(job(id="tr", sweep={"LR": [1e-3, 3e-4], "SEED": [0, 1, 2], "BIG": [True]},
                                      max_running=2))
    assert spec.sweep == {"LR": ["0.001", "0.0003"], "SEED": ["0", "1", "2"], "BIG": ["true"]}
    tasks = group_tasks("tr", sweep=spec.sweep)
    assert [t.id for t in tasks] == [f"tr-{i}" for i in range(6)]
    assert [(t.env["LR"], t.env["SEED"]) for t in tasks][:4] == [("0.001", "0"), ("0.001", "1"), ("0.001", "2"),
                                                                 ("0.0003", "0")]
    assert spec.group_limit == 2 and JobSpec.model_validate(job(array="0-9%3")).group_limit == 3


def test_a_job_files_sweep_values_are_what_yaml_read_them_as():
    """USING.md's example file: YAML 1.1 reads `1e-3` (no dot) as text, kept as written; `3.0e-4` is a number."""
    from tpuq.contracts.yamltext import load

    entry = load("id: tr\ntpu: v4-8\ncommand: x\nsweep: {LR: [1e-3, 3.0e-4, 0.001]}\n")
    assert JobSpec.model_validate(entry).sweep == {"LR": ["1e-3", "0.0003", "0.001"]}


def test_a_file_may_not_hold_a_job_named_like_a_task_of_its_group():
    with pytest.raises(ValidationError) as e:
        JobFile.model_validate({"jobs": [job(id="tr", array=3), job(id="tr-1")]})
    assert "'tr-1' is used twice" in str(e.value)


def test_a_task_env_carries_its_index_and_the_group_size():
    a = make_assignment().model_copy(update={"array_index": 4, "array_size": 6})
    env = AttemptPlan.from_assignment(a).worker_spec(0, "/home/u", WorkerSettings())["env"]
    assert {k: v for k, v in env.items() if k in ARRAY_ENV} == {"TPUQ_ARRAY_INDEX": "4", "TPUQ_ARRAY_SIZE": "6"}
    plain = AttemptPlan.from_assignment(make_assignment()).worker_spec(0, "/home/u", WorkerSettings())["env"]
    assert not set(plain) & ARRAY_ENV


def test_hold_back_offers_a_group_only_its_room_in_queue_order():
    def task(i, group="g", limit=2):
        return JobDoc(id=f"{group}-{i}", state=JobState.pending, group=group, array_index=i, array_limit=limit)

    jobs = {j.id: j for j in [task(i) for i in range(5)] + [JobDoc(id="solo", state=JobState.pending)]
            + [task(i, "free", None) for i in range(3)]}
    order = list(jobs)
    assert sorted(hold_back(order, jobs, {})) == ["g-2", "g-3", "g-4"]
    assert sorted(hold_back(order, jobs, {"g": 1})) == ["g-1", "g-2", "g-3", "g-4"]
    assert sorted(hold_back(order, jobs, {"g": 5})) == [f"g-{i}" for i in range(5)]


def test_the_in_memory_firestore_refuses_a_commit_of_more_than_500_writes_as_firestore_does():
    from google.api_core.exceptions import InvalidArgument

    from tpuq_dev.inmemory import MemoryFirestore

    db = MemoryFirestore()
    batch = db.batch()
    for i in range(501):
        batch.create(db.collection("jobs").document(f"j{i}"), {"n": i})
    with pytest.raises(InvalidArgument, match="500 writes"):
        batch.commit()
    assert not list(db.collection("jobs").stream())


def test_submitting_a_thousand_task_group_is_one_upload_and_one_publish(tmp_path):
    """`tpuq submit` does not expand a group: the scheduler does (tpuq.scheduler.arrays)."""
    import random

    from tpuq.operations.submit import prepare, submit_prepared

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    jobs = JobFile.model_validate({"jobs": [job(id="big", bundle="code", array=MAX_ARRAY_TASKS)]})
    uploads, published = [], []

    class Blob:
        def __init__(self, name):
            self.name = name

        def upload_from_string(self, data, **_):
            uploads.append(self.name)

    class Storage:
        def bucket(self, name):
            return type("B", (), {"blob": lambda _self, n: Blob(f"{name}/{n}")})()

    class Clients:
        storage = Storage()

        def publish(self, topic, message, **_):
            published.append((topic, message))

    prepared = prepare(tmp_path / "job.yaml", jobs, "gs://tpuq-runner", random.Random(0))
    assert submit_prepared(Clients(), prepared) == ["big"]
    assert len(uploads) == 1 and len(published) == 1
    topic, message = published[0]
    assert topic == "jobs" and message.array == MAX_ARRAY_TASKS and message.id == "big"
