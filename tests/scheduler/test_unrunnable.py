"""A job no fleet entry can ever run: the reason `tpuq submit` refuses it with and the intake stores it blocked
with, naming what the fleet offers (tpuq.scheduler.capacity.unrunnable_reason)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpuq.contracts.fleet import FleetFile
from tpuq.scheduler.capacity import unrunnable_reason
from tpuq.scheduler.plan import PendingJob

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
FLEET = FleetFile.model_validate({
    "name": "lab", "project": "p", "tpus": [
        {"id": "a", "type": "v4-8", "zones": ["us-central2-a", "us-central2-b"], "count": 1},
        {"id": "b", "type": "v4-8", "zones": ["us-central2-b", "us-central2-c"], "count": 1},
        {"id": "c", "type": "v5litepod-8", "zones": ["europe-west4-a"], "count": 1}]})
OFFERS = "fleet lab offers v4-8 in us-central2-a, us-central2-b, us-central2-c; v5litepod-8 in europe-west4-a"


@pytest.mark.parametrize("job, reason", [
    (dict(types=("v4-8",)), None),
    (dict(types=("v5e-8",), zone="europe-west4-a"), None),  # a friendly name is the canonical type
    (dict(types=("v5p-8",)), f"no fleet entry offers v5p-8; {OFFERS}"),
    (dict(types=("v4-8",), zone="us-east1-d"), f"no fleet entry offers v4-8 in zone us-east1-d; {OFFERS}"),
    (dict(types=("v4-8",), regions={"europe-west4"}), f"no fleet entry offers v4-8 in regions europe-west4; {OFFERS}"),
])
def test_the_reason_names_what_the_fleet_offers(job, reason):
    assert unrunnable_reason(PendingJob("j", "normal", submit_time=NOW, **job), FLEET) == reason


def test_without_a_stored_fleet_nothing_is_known():
    assert unrunnable_reason(PendingJob("j", "normal", ("v5p-8",), NOW), None) is None


def test_submit_names_the_refused_job_as_the_file_does(tmp_path):
    """`tpuq submit`'s refusal names `jobs[1] (eval)`, by the name or id the file gave: an id made for the job
    before submitting exists nowhere the user could look."""
    import random

    from tpuq.cli.jobs import unrunnable_jobs
    from tpuq.contracts.jobspec import JobFile
    from tpuq.operations.submit import prepare

    jobs = JobFile.model_validate({"jobs": [
        {"name": "train", "tpu": "v4-8", "command": "x"}, {"name": "eval", "tpu": "v6e-8", "command": "x"},
        {"id": "probe-1", "tpu": "v5p-8", "command": "x"}, {"tpu": "v5p-8", "command": "x"}]})
    prepared = prepare(tmp_path / "job.yaml", jobs, None, random.Random(0))
    lines = unrunnable_jobs(prepared, FLEET, NOW)
    assert [line.split(": ", 1)[0] for line in lines] == ["jobs[1] (eval)", "jobs[2] (probe-1)", "jobs[3]"]
    assert lines[0] == f"jobs[1] (eval): no fleet entry offers v6e-8; {OFFERS}"
    # `tpuq submit --job-id probe-1`: the job is still named by its place in the file
    from tpuq.operations.submit import file_indices, select_jobs

    chosen = select_jobs(jobs, ["probe-1"])
    [line] = unrunnable_jobs(prepare(tmp_path / "job.yaml", chosen, None, random.Random(0),
                                     indices=file_indices(jobs, chosen)), FLEET, NOW)
    assert line.startswith("jobs[2] (probe-1): no fleet entry offers v5p-8")
