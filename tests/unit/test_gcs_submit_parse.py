"""The bucket upload's pure part: job ids from the job's name (deterministic per upload), `bundle: .` as the job
file's folder in the bucket, and refusals that name the field, YAML's with line and column."""

from __future__ import annotations

import pytest

from tpuq.contracts.errors import Permanent
from tpuq.scheduler.gcs_submit import bundle_folder, gcs_job_id, parse_job_file

JOB = "jobs:\n  - name: My Train\n    tpu: v4-8\n    bundle: .\n    command: sh run.sh\n  - tpu: v4-8\n    command: x\n"


def test_ids_use_the_name_and_are_the_same_for_one_upload_and_new_for_the_next():
    jobs, folders = parse_job_file(JOB, "b", "submit/proj/job.yaml", "17")
    again, _ = parse_job_file(JOB, "b", "submit/proj/job.yaml", "17")
    later, _ = parse_job_file(JOB, "b", "submit/proj/job.yaml", "18")
    assert [j.id for j in jobs] == [j.id for j in again]
    assert jobs[0].id.startswith("my-train-") and len(jobs[0].id) == len("my-train-") + 8
    assert jobs[1].id.startswith("job-")  # no name: the file's name
    assert {j.id for j in later}.isdisjoint({j.id for j in jobs})
    assert folders == {0: "submit/proj/"} and jobs[0].bundle is None  # packed by the handler


def test_an_explicit_id_wins():
    [job], _ = parse_job_file("jobs:\n  - {id: mine, name: x, tpu: v4-8, command: x}\n", "b", "submit/j.yaml", "1")
    assert job.id == "mine"


@pytest.mark.parametrize("name, bundle, folder", [
    ("submit/proj/job.yaml", ".", "submit/proj/"),
    ("submit/proj/job.yaml", "./src", "submit/proj/src/"),
    ("submit/job.yaml", ".", "submit/"),
    ("submit/proj/job.yaml", "..", "submit/"),
    ("submit/job.yaml", "..", None),
    ("submit/a/job.yaml", "../../other", None),
])
def test_bundle_folder(name, bundle, folder):
    assert bundle_folder(name, bundle) == folder


@pytest.mark.parametrize("text, field, reason", [
    ("jobs:\n  - tpu: v4-8\n    command: [x\n", "(job file)", "not valid YAML at line 4, column 1"),
    ("jobs:\n  - tpu: v4-8\n   command: x\n", "(job file)", "not valid YAML at line 3, column 4"),
    ("- a\n", "(job file)", "must be a mapping"),
    ("jobs:\n  - tpu: v4-8\n    priority: urgent\n    command: x\n", "jobs[0].priority", "'low', 'normal' or 'high'"),
    ("jobs:\n  - {tpu: v4-8, command: x, bundle: ../..}\n", "jobs[0].bundle", "leaves the folder submit/"),
])
def test_refusals_name_the_field_and_the_reason(text, field, reason):
    with pytest.raises(Permanent) as e:
        parse_job_file(text, "b", "submit/job.yaml", "1")
    assert e.value.field == field
    assert reason in str(e.value)


def test_a_misspelt_field_in_an_uploaded_file_is_told_the_one_meant():
    with pytest.raises(Permanent) as refused:
        parse_job_file("jobs:\n  - tpu: v4-8\n    command: x\n    priorty: high\n", "b", "submit/j.yaml", "1")
    assert refused.value.field == "jobs[0].priorty" and "did you mean `priority`?" in str(refused.value)


def test_a_key_given_twice_in_an_uploaded_file_is_refused_with_its_line():
    with pytest.raises(Permanent) as refused:
        parse_job_file("jobs:\n  - tpu: v4-8\n    command: a\n    command: b\n", "b", "submit/j.yaml", "1")
    assert refused.value.field == "(job file)" and "line 4" in str(refused.value) and "twice" in str(refused.value)
