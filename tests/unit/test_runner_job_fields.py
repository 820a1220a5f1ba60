"""tpu-runner's job fields added since 0.1.8 (issue 15 §3): `tpu: any` and `retry_on_infrastructure_failure`."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from tpuq.contracts.fleet import FleetFile, RetryBudgets
from tpuq.contracts.jobspec import JobFile, JobSpec, Priority
from tpuq.contracts.messages import AttemptOutcome, FleetEvent, FleetEventKind
from tpuq.scheduler import lifecycle
from tpuq.scheduler.capacity import ask_for_capacity, room_per_entry
from tpuq.scheduler.plan import IdleTpu, PendingJob, plan

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
FLEET = FleetFile.model_validate({"name": "f", "project": "p", "tpus": [
    {"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 1},
    {"id": "v6e", "type": "v6e-8", "zones": ["us-east1-d"], "count": 1},
    {"id": "v5e", "type": "v5litepod-8", "zones": ["europe-west4-b"], "count": 1}]})


def pending(spec: dict, job_id="j1") -> PendingJob:
    return PendingJob.from_spec(JobSpec.model_validate({"command": "x", **spec}), NOW, job_id=job_id)


@pytest.mark.parametrize("tpu", ["any", "ANY", ["any"]])
def test_tpu_any_is_accepted(tpu):
    spec = JobSpec.model_validate({"tpu": tpu, "command": "x"})
    assert spec.tpu == ["any"] and spec.any_tpu


def test_tpu_any_stands_alone():
    with pytest.raises(ValidationError, match="give it alone"):
        JobSpec.model_validate({"tpu": ["any", "v4-8"], "command": "x"})


def test_tpu_any_runs_on_any_idle_tpu_the_job_may_use():
    tpus = [IdleTpu("a", "v6e-8", "us-east1-d"), IdleTpu("b", "v4-8", "us-central2-b")]
    result = plan([pending({"tpu": "any"}, "j1"), pending({"tpu": "any", "zone": "us-central2-b"}, "j2")], tpus,
                  FLEET, NOW)
    assert {m.job_id: m.tpu_name for m in result.matches} == {"j1": "a", "j2": "b"}


def test_tpu_any_asks_for_every_type_its_regions_allow():
    room = room_per_entry(FLEET, {}, {})
    asks, blocked = ask_for_capacity([(pending({"tpu": "any"}), 0)], FLEET, room, NOW)
    assert asks[0].message.types == ["v4-8", "v6e-8", "v5litepod-8"] and not blocked
    regional = pending({"tpu": "any", "buckets": ["gs://data-us-east1"]}, "j2")
    asks, _ = ask_for_capacity([(regional, 0)], FLEET, room_per_entry(FLEET, {}, {}), NOW)
    assert asks[0].message.types == ["v6e-8"]
    nowhere = pending({"tpu": "any", "zone": "asia-east1-c"}, "j3")
    _, blocked = ask_for_capacity([(nowhere, 0)], FLEET, room_per_entry(FLEET, {}, {}), NOW)
    assert blocked["j3"].startswith("no fleet entry offers a TPU in zone asia-east1-c")


def running_job(retry: bool | None) -> dict:
    spec = {"id": "j1", "tpu": ["v4-8"], "command": "x"}
    if retry is not None:
        spec["retry_on_infrastructure_failure"] = retry
    return {"id": "j1", "state": "running", "spec": spec, "attempt": 1, "attempt_id": "j1-1", "tpu": "n1",
            "preemptions": 0, "infra_failures": 0, "region": "us-central2"}


@pytest.mark.parametrize("retry, outcome, state", [
    (None, AttemptOutcome.preempted, "pending"),  # default: true, as in tpu-runner
    (True, AttemptOutcome.infra_failed, "pending"),
    (False, AttemptOutcome.preempted, "failed"),
    (False, AttemptOutcome.infra_failed, "failed"),
    (False, AttemptOutcome.failed, "failed"),
    (False, AttemptOutcome.succeeded, "succeeded"),
])
def test_retry_on_infrastructure_failure(retry, outcome, state):
    end = lifecycle.attempt_ended(running_job(retry), 1, outcome, "boom", RetryBudgets(), NOW, random.Random(1))
    assert end.job["state"] == state
    if retry is False and state == "failed" and outcome is not AttemptOutcome.failed:
        assert "retry_on_infrastructure_failure: false" in end.job["reason"]


def test_retry_off_ends_the_job_when_its_tpu_is_lost():
    event = FleetEvent(kind=FleetEventKind.suspended, fleet="f", node="n1", zone="us-central2-b", at=NOW,
                       queued_resource="projects/p/locations/us-central2-b/queuedResources/q1", type="v4-8")
    tpu = {"name": "n1", "short": "n1", "state": "busy", "job_id": "j1", "attempt_id": "j1-1"}
    lost = lifecycle.node_lost(tpu, "j1", running_job(False), event, RetryBudgets(), NOW, random.Random(1))
    assert lost.end.job["state"] == "failed" and "not retried" in lost.end.job["reason"]


def test_retry_off_with_retry_budgets_is_refused():
    with pytest.raises(ValidationError, match="retry_on_infrastructure_failure: false retries nothing"):
        JobFile.model_validate({"jobs": [{"tpu": "v4-8", "command": "x", "retry_on_infrastructure_failure": False,
                                          "max_preemptions": 3}]})
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"tpu": "v4-8", "command": "x", "retry_on_infrastructure_failure": "no"})


# ---- tpuq submit --job-id (tpu-runner's): select jobs of a file by id; name the one job of a file without ids

def job_file(*ids) -> JobFile:
    return JobFile.model_validate({"jobs": [{"tpu": "v4-8", "command": "x", **({"id": i} if i else {})}
                                            for i in ids]})


@pytest.mark.parametrize("ids, given, chosen", [
    ((None,), ["train-1"], ["train-1"]),  # one job without an id: it takes the id
    (("a",), ["a"], ["a"]),
    (("a", "b", "c"), ["c", "a"], ["a", "c"]),  # file order, as tpu-runner
    (("a", "b"), [], ["a", "b"]),
])
def test_select_jobs(ids, given, chosen):
    from tpuq.operations.submit import select_jobs

    assert [j.id for j in select_jobs(job_file(*ids), given).jobs] == chosen


@pytest.mark.parametrize("ids, given, words", [
    (("a",), ["b"], "--job-id b: no job in the file has this id (ids in the file: a)"),
    ((None, None), ["x"], "--job-id x: no job in the file has this id (ids in the file: none)"),
    ((None,), ["a", "b"], "one job, and --job-id is given 2 times"),
    (("a", "b"), ["a", "a"], "--job-id a is given twice"),
    ((None,), ["Bad_Id"], "--job-id 'Bad_Id': must be"),
])
def test_select_jobs_errors(ids, given, words):
    from tpuq.operations.submit import select_jobs

    with pytest.raises(ValueError) as e:
        select_jobs(job_file(*ids), given)
    assert words in str(e.value)


@pytest.mark.parametrize("given, seconds", [("2h", 7200), ("90m", 5400), ("3600", 3600), (3600, 3600),
                                            ("1h30m", 5400), ("45s", 45), ("1d", 86400), (None, None)])
def test_max_duration_takes_seconds_or_a_duration(given, seconds):
    """dstack's `max_duration`: the longest one attempt may run, stored in seconds."""
    spec = JobSpec.model_validate({"tpu": "v4-8", "command": "x", "max_duration": given})
    assert spec.max_duration == seconds
    assert JobSpec.model_validate(spec.model_dump(mode="json")).max_duration == seconds  # as stored, read again


@pytest.mark.parametrize("given", ["2 hours", "2x", "", "h", 0, -5, True, 1.5, "400d"])
def test_max_duration_refuses_what_is_not_a_duration_and_names_the_field(given):
    from tpuq.cli.files import validate_data
    from tpuq.cli.console import CliError

    with pytest.raises(CliError, match=r"jobs\[0\]\.max_duration: .*(not a number of seconds|between 1 second)"):
        validate_data({"jobs": [{"tpu": "v4-8", "command": "x", "max_duration": given}]}, "job")


def test_durations_read_back_as_a_reason_says_them():
    from tpuq.contracts.jobspec import format_duration

    assert [format_duration(s) for s in (7200, 5400, 90, 45, 86400, 0)] == ["2h", "1h30m", "1m30s", "45s", "1d", "0s"]
