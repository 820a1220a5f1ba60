"""The job field `slices:` (issue 37): its forms, its refusals (each naming the field and the reason), the refusal at
submit until multislice jobs are run, what the scheduler and `tpuq validate` read of it against a fleet."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone

import pytest
import yaml
from pydantic import ValidationError

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import JobFile, JobSpec, PublishedJob
from tpuq.contracts.multislice import MAX_SLICES
from tpuq.scheduler.capacity import unrunnable_reason
from tpuq.scheduler.multislice_fit import fit_notes, unholdable_reason
from tpuq.scheduler.plan import PendingJob

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def spec(**kw) -> JobSpec:
    return JobSpec(**{"id": "ms", "tpu": "v4-32", "command": "train", **kw})


def refusal(**kw) -> str:
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    return str(e.value)


@pytest.mark.parametrize("given, stored, counts", [
    (None, None, (1,)), (1, None, (1,)), ([1], None, (1,)), (2, 2, (2,)), ([3], 3, (3,)),
    ([4, 2], [4, 2], (4, 2)), ([4, 2, 1], [4, 2, 1], (4, 2, 1)), (MAX_SLICES, MAX_SLICES, (MAX_SLICES,)),
])
def test_the_forms_of_slices(given, stored, counts):
    job = spec(**({} if given is None else {"slices": given}))
    assert job.slices == stored and job.slice_counts == counts


@pytest.mark.parametrize("given, says", [
    (0, "0 slices: a job runs on at least 1 slice"),
    (-2, "-2 slices: a job runs on at least 1 slice"),
    (MAX_SLICES + 1, f"tpuq runs a job on at most {MAX_SLICES}"),
    ([2, 4], "[1]: 4 after 2: list the counts to try largest first, e.g. [4, 2]"),
    ([4, 4], "[1]: 4 is listed twice"),
    ([4, 1, 2], "[2]: 2 after 1"),
    ([], "an empty list"),
    ("two", "'two' is not a whole number of slices"),
    (True, "True is not a whole number of slices"),
    (2.5, "2.5 is not a whole number of slices"),
])
def test_bad_counts_are_refused_naming_the_field(given, says):
    message = refusal(slices=given)
    assert "slices" in message.splitlines()[1] and says in message


@pytest.mark.parametrize("fields, says", [
    ({"tpu": "any"}, "every slice of a multislice job is of one TPU type"),
    ({"tpu": ["v4-32", "v4-16"]}, "name one of v4-32, v4-16, not a list"),
    ({"tpu": "v3-32"}, "Cloud TPU Multislice needs TPU v4 or later"),
    ({"tpu_name": "my-node"}, "tpu_name names one node, which is one slice"),
])
def test_multislice_refuses_what_a_gang_cannot_be(fields, says):
    message = refusal(slices=[4, 2], **fields)
    assert "slices: [4, 2]: " + says in message or ("slices: [4, 2]" in message and says in message)


def test_one_slice_keeps_every_field_it_had():
    assert spec(tpu=["v4-32", "v4-16"], slices=1).slice_counts == (1,)
    assert spec(tpu="any", tpu_name="n").slices is None


def test_a_multislice_job_is_published_and_a_single_slot_type_may_be_one():
    """PublishedJob is what the CLI publishes and every intake (topic, GCS drop) parses. A single_slot type's gang
    is one queued resource, raced alone like its single slices."""
    assert PublishedJob(tpu="v4-32", command="x", slices=2).slices == 2
    assert PublishedJob(tpu="v6e-16", command="x", slices=[4, 2]).slices == [4, 2]
    assert PublishedJob(tpu="v4-32", command="x", slices=1).slices is None
    assert JobFile.model_validate({"jobs": [{"tpu": "v4-32", "command": "x", "slices": [4, 2]}]}).jobs[0].slices


def fleet(*entries, quota=None) -> FleetFile:
    return FleetFile(name="lab", project="p", tpus=list(entries), quota=quota)


def v4(entry_id, count=4, zones=("us-central2-b",), **kw) -> dict:
    return {"id": entry_id, "type": "v4-32", "zones": list(zones), "count": count, **kw}


def pending(**kw) -> PendingJob:
    return PendingJob.from_spec(spec(**kw), NOW)


def test_no_entry_can_hold_the_gang_names_each_entry_and_why():
    lab = fleet(v4("small", count=1), v4("capped", count=8, chip_limit=16), v4("quota", count=4),
                quota={"us-central2-b": {"v4": {"spot": 16}}})
    reason = unrunnable_reason(pending(slices=2), lab)
    assert reason.startswith("no fleet entry can hold 2 v4-32 slices at once in one zone: ")
    assert "entry small holds at most 1 slice(s) (count 1), below 2" in reason
    assert "entry capped holds at most 1 slice(s) (count 8, chip_limit 16), below 2" in reason
    assert "entry quota's declared spot quota (us-central2-b 16 chips) is below 2 x 16 = 32 chips" in reason


def test_an_entry_that_holds_the_gang_or_an_undeclared_quota_is_enough():
    assert unrunnable_reason(pending(slices=2), fleet(v4("big", count=2))) is None
    enough = fleet(v4("q", count=2), quota={"us-central2-b": {"v4": {"spot": 32}}})
    assert unholdable_reason(pending(slices=2), enough) is None
    assert unrunnable_reason(pending(), fleet(v4("small", count=1))) is None  # one slice: as before


def test_a_single_slot_entry_holds_a_gang():
    assert unholdable_reason(pending(slices=2), fleet(v4("slot", count=4, single_slot=True))) is None


def test_an_elastic_job_is_told_the_largest_count_the_fleet_can_hold():
    lab = fleet(v4("two", count=2))
    assert unholdable_reason(pending(slices=[4, 2]), lab) is None
    assert fit_notes(pending(slices=[4, 2]), lab) == [
        "slices [4, 2]: 2 is the largest of these counts fleet lab can hold at once in one zone (4: entry two holds "
        "at most 2 slice(s) (count 2), below 4), so the larger counts are never had"]


def tpuq(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def test_tpuq_validate_explains_a_multislice_job_no_entry_can_hold(tmp_path):
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "name": "lab", "project": "p", "tpus": [v4("small", count=1)], "ssh_key_secret": "k"}))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"jobs": [
        {"name": "train", "tpu": "v4-32", "slices": 2, "command": "python train.py"},
        {"name": "one", "tpu": "v4-32", "command": "python train.py"}]}))
    r = tpuq("validate", "fleet.yaml", "job.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: job.yaml with fleet.yaml: job train: no fleet entry can hold 2 v4-32 slices at once in one zone: "
        "entry small holds at most 1 slice(s) (count 1), below 2",
    ]
