"""A job is bounded in size, so its document always fits Firestore's 1 MiB (production-facts.md, "Firestore document
size"): one too big is refused where it is written, field and reason, instead of failing every write of it.

`tpuq submit` and `tpuq validate` refuse it before anything is uploaded; the scheduler's intake (tests/scheduler/
test_job_size_limits.py) refuses what gcloud publishes past them.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone

import pytest
import yaml
from pydantic import ValidationError

from tpuq.cli.console import CliError
from tpuq.cli.files import validate_data
from tpuq.contracts.errors import describe_validation_error
from tpuq_dev.inmemory.firestore import MAX_DOCUMENT_BYTES, document_size
from tpuq.contracts.jobspec import MAX_COMMAND_BYTES, MAX_ENV_BYTES, MAX_ENV_VALUE_BYTES, MAX_SPEC_BYTES, PublishedJob
from tpuq.contracts.messages import Assignment, WorkerEndpoint
from tpuq.scheduler.intake import job_document

JOB = {"id": "j1", "tpu": "v4-8", "command": "python train.py"}


def refusal(**fields) -> tuple[str, str]:
    with pytest.raises(ValidationError) as e:
        PublishedJob.model_validate({**JOB, **fields})
    return describe_validation_error(e.value)


def test_a_command_up_to_its_limit_is_taken_and_one_byte_more_is_refused():
    assert PublishedJob.model_validate({**JOB, "command": "x" * MAX_COMMAND_BYTES})
    field, reason = refusal(command="x" * (MAX_COMMAND_BYTES + 1))
    assert field == "command"
    assert "65,537 bytes" in reason and "at most 65,536" in reason and "1 MiB" in reason and "bundle" in reason


def test_sizes_are_utf8_bytes_not_characters():
    field, reason = refusal(command="é" * (MAX_COMMAND_BYTES // 2 + 1))  # 2 bytes each: under the limit in characters
    assert field == "command" and f"{MAX_COMMAND_BYTES + 2:,} bytes" in reason


def test_an_env_value_over_its_limit_is_refused_by_name():
    assert PublishedJob.model_validate({**JOB, "env": {"V": "x" * MAX_ENV_VALUE_BYTES}})
    field, reason = refusal(env={"SMALL": "1", "BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)})
    assert field == "env" and "'BIG'" in reason and f"at most {MAX_ENV_VALUE_BYTES:,}" in reason


def test_env_over_its_total_is_refused_though_every_value_fits():
    value = "x" * (MAX_ENV_VALUE_BYTES - 10)
    assert PublishedJob.model_validate({**JOB, "env": {"A": value, "B": value}})  # 65,518 bytes with the names
    field, reason = refusal(env={"A": value, "B": value, "C": "x" * 100})
    assert field == "env" and "together" in reason and f"at most {MAX_ENV_BYTES:,}" in reason


def test_the_whole_job_is_bounded_naming_its_largest_field():
    caches = [{"key": f"k{i}", "path": "p" * 1000} for i in range(300)]  # no field of its own limits this
    field, reason = refusal(caches=caches)
    assert field == "caches" and f"at most {MAX_SPEC_BYTES:,}" in reason and "1 MiB" in reason


def test_the_largest_job_taken_fits_its_documents_with_room_to_spare():
    """At every limit at once, the job's document (and the assignment the executor keeps) stays under half of
    Firestore's 1 MiB, by Firestore's own size rules."""
    env = {f"V{i}": "x" * (MAX_ENV_BYTES // 2 - 3) for i in range(2)}
    base = {**JOB, "command": "c" * MAX_COMMAND_BYTES, "env": env}
    room = MAX_SPEC_BYTES - len(PublishedJob.model_validate(base).model_dump_json(exclude_none=True)) - 400
    job = PublishedJob.model_validate({**base, "name": "n" * 200, "caches": [{"key": "k", "path": "p" * room}]})
    assert len(job.model_dump_json(exclude_none=True)) > MAX_SPEC_BYTES - 1000  # as large as a job may be
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    doc = job_document(job, "j1", "cli", "m" * 20, now, blocked="b" * 2000, owner="someone@example.com")
    doc.update(reason="r" * 8000, cancel_reason="c" * 2000)
    assert document_size("jobs/j1", doc) < MAX_DOCUMENT_BYTES // 2
    endpoints = [WorkerEndpoint(worker_id=i, ip=f"10.0.{i // 250}.{i % 250}", external_ip=f"34.0.{i // 250}.{i % 250}")
                 for i in range(512)]
    assignment = Assignment(job_id="j1", attempt=1, attempt_id="j1-1", node="projects/p/locations/z/nodes/n",
                            zone="us-central2-b", endpoints=endpoints, job=job, at=now)
    assert document_size("executions/j1:1", {"assignment": assignment.model_dump(mode="json")}) < MAX_DOCUMENT_BYTES // 2


def test_a_job_file_names_the_job_and_the_field():
    with pytest.raises(CliError) as e:
        validate_data({"jobs": [JOB, {**JOB, "id": "j2", "env": {"BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)}}]}, "job")
    assert "jobs[1].env: the value of 'BIG'" in str(e.value)


def test_tpuq_submit_refuses_a_too_large_job_before_uploading_anything(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"jobs": [{"tpu": "v4-8", "command": "x" * (MAX_COMMAND_BYTES + 1)}]}))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    r = subprocess.run(["tpuq", "submit", str(job_file)], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert r.returncode != 0
    assert "jobs[0].command: is 65,537 bytes" in r.stderr, r.stderr
